"""``%%step`` and ``%step``: parse arguments, make one call, turn errors into UsageError."""

from __future__ import annotations

import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from .. import commands, config, status
from ..durable.session import Session, get_session
from ..errors import LeaseHeld, StoreError, UsageProblem
from ..identity import keys, stepline
from ..store import RunView
from ..text import one_line
from . import cellstep
from .host import session_for

_SUBCOMMANDS = stepline.STEP_COMMANDS


@magics_class
class StepMagics(Magics):
    """The ``step`` line and cell magic."""

    @line_cell_magic
    def step(self, line: str = "", cell: str | None = None) -> None:
        """Record a cell as a durable step, or manage the run's steps.

        ::

            %%step [NAME] [--force]     record this cell as a step (replayed on rerun)
                [--inputs PATTERN ...]   files it reads that nbdurable cannot see
                                         (globs, relative to the working directory)
            %step list                   every step of the run and its state
            %step clear NAME [NAME ...]  forget steps (and their sub-steps); --all: the run
            %step pin NAME | unpin NAME  replay a step even when invalidated / stop doing so
            %step run [NAME]             switch to a named run (no NAME: the notebook's own)
            %step fork NEW [--from STEP] a new run sharing this one's records before STEP;
                                         then record into it
            %step panel                  show the step panel
            %step takeover               take the run's lease from another (stuck) runner
        """
        __tracebackhide__ = True
        try:
            if cell is None:
                self._line(line)
            else:
                self._cell(line, cell)
        except (UsageProblem, StoreError, LeaseHeld) as exc:
            # One line, no traceback: each message already says what to do.
            raise UsageError(one_line(exc)) from None

    def _cell(self, line: str, cell: str) -> None:
        __tracebackhide__ = True
        args = stepline.parse(line)
        if args.http:
            raise UsageProblem(
                "%%step --http records the HTTP of a cell's body; it cannot be used "
                "from run_cell_magic: run the step as a cell, or wrap calls in step()"
            )
        session_for(self.shell).steps.run_step(
            cell, name=args.name, force=args.force, input_patterns=args.inputs
        )

    def _line(self, line: str) -> None:
        args = _split(line)
        if not args:
            known = ", ".join(_SUBCOMMANDS)
            raise UsageProblem(f"%step needs a command: {known} (see %step?)")
        cmd, rest = args[0], args[1:]
        session = session_for(self.shell)
        if cmd == "list":
            _no_args(cmd, rest)
            infos = status.step_infos(
                session.store,
                session.run_id,
                session.notebook,
                session.status,
                session.steps.current_inputs,
                session.steps.brief_now,
            )
            with session.lock:
                spared = session.saved.line(config.get().prices)
            parent = RunView(session.store, session.run_id).parent()
            forked = f" (forked from {parent!r})" if parent else ""
            print(f"run {session.run_id!r}{forked} in {session.store.path} — {spared}")
            if session.lost:
                print(f"not recording: {session.lost}")
            print(status.format_table(infos) if infos else "no steps recorded yet")
        elif cmd == "clear":
            if rest == ["--all"]:
                self._done(session, commands.clear_run(session.store, session.run_id))
            elif not rest or any(a.startswith("-") for a in rest):
                raise UsageProblem("usage: %step clear NAME [NAME ...] or %step clear --all")
            else:
                self._done(
                    session,
                    commands.clear_steps(session.store, session.run_id, rest, session.notebook),
                )
        elif cmd in ("pin", "unpin"):
            if not rest:
                raise UsageProblem(f"%step {cmd} needs a step NAME (see %step list)")
            done = commands.pin_steps(
                session.store, session.run_id, rest, session.notebook, pinned=cmd == "pin"
            )
            self._done(session, done)
        elif cmd == "run":
            if len(rest) > 1:
                raise UsageProblem(f"%step run takes one NAME, got {len(rest)}")
            name = keys.validate_name(rest[0], "run name") if rest else None
            print(f"nbdurable run: {session.set_run(name)!r}")
        elif cmd == "fork":
            self._fork(session, rest)
        elif cmd == "takeover":
            _no_args(cmd, rest)
            self._done(session, commands.take_over(session))
        elif cmd == "panel":
            _no_args(cmd, rest)
            from .panel import panel

            panel().show()
        else:
            known = ", ".join(_SUBCOMMANDS)
            raise UsageProblem(f"%step: unknown command {keys._shown(cmd)}; commands: {known}")

    @staticmethod
    def _fork(session: Session, rest: list[str]) -> None:
        """``%step fork NEW [--from STEP]``: fork this run, then record into the fork."""
        usage = "usage: %step fork NEW [--from STEP]"
        from_step = None
        if len(rest) == 3 and rest[1] == "--from":
            from_step = rest[2]
        elif len(rest) != 1 or rest[0].startswith("-"):
            raise UsageProblem(usage)
        done = commands.fork(session.store, session.run_id, rest[0], session.notebook, from_step)
        print(done.message)
        print(f"nbdurable run: {session.set_run(rest[0])!r}")

    @staticmethod
    def _done(session: Session, done: commands.Done) -> None:
        session.changed(done)
        print(done.message)


def _split(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise UsageProblem(f"%step: cannot parse arguments ({exc})") from None


def _no_args(cmd: str, rest: list[str]) -> None:
    if rest:
        raise UsageProblem(f"%step {cmd} takes no arguments, got {keys._shown(' '.join(rest))}")


def load(ipython) -> None:  # noqa: ANN001
    """Register the magics, the ``%%step`` cell transformers and the per-cell hooks."""
    _remove_transformers(ipython)  # a %reload_ext must not add them twice
    global _cell
    _cell = cellstep.StepCell(ipython)
    ipython.input_transformers_post.append(cellstep.StepCellTransformer(ipython))
    ipython.ast_transformers.append(cellstep.StepCellAst())
    _install_marker(ipython)
    if tuple(ipython.custom_exceptions) in ((), cellstep.ONE_LINE):  # a user's own: kept
        ipython.set_custom_exc(cellstep.ONE_LINE, cellstep.one_line_errors(_cell))
    ipython.register_magics(StepMagics)
    ipython.events.register("pre_run_cell", _pre_run_cell)
    ipython.events.register("post_run_cell", _post_run_cell)


def unload(ipython) -> None:  # noqa: ANN001
    """Unregister the per-cell hooks and transformers (magics are replaced on the next load)."""
    global _cell
    for event, hook in (("pre_run_cell", _pre_run_cell), ("post_run_cell", _post_run_cell)):
        try:
            ipython.events.unregister(event, hook)
        except ValueError:
            pass
    _remove_transformers(ipython)
    if tuple(ipython.custom_exceptions) == cellstep.ONE_LINE:
        ipython.set_custom_exc((), None)
    if _cell is not None:
        _cell.close(None, stale=True)
        _cell = None
    ipython.user_ns.pop(cellstep.MARKER, None)
    ipython.user_ns_hidden.pop(cellstep.MARKER, None)
    get_session().new_cell(hooked=False)  # nothing marks cells any more


_cell: cellstep.StepCell | None = None


def _remove_transformers(ipython) -> None:  # noqa: ANN001
    # By class name and module: after a reload the classes are new objects.
    def ours(t: object) -> bool:
        return type(t).__module__ == cellstep.__name__

    ipython.input_transformers_post[:] = [t for t in ipython.input_transformers_post if not ours(t)]
    ipython.ast_transformers[:] = [t for t in ipython.ast_transformers if not ours(t)]


def _install_marker(ipython) -> None:  # noqa: ANN001
    # Hidden from %who and from what steps record; put back if %reset removed it.
    if _cell is not None and ipython.user_ns.get(cellstep.MARKER) is not _cell:
        ipython.user_ns[cellstep.MARKER] = _cell
        ipython.user_ns_hidden[cellstep.MARKER] = _cell


def _pre_run_cell(info: object = None) -> None:
    if _cell is not None:
        # A silent execution (no post_run_cell) may have left a step open.
        _cell.close(None, stale=True)
        _install_marker(_cell.shell)
    get_session().new_cell()


def _post_run_cell(result: object = None) -> None:
    if _cell is not None:
        _cell.close(result)
    session = get_session()
    session.end_cell()  # what a plain cell's sub-steps printed is recorded up to here
    # What the cell unbound is not kept alive by nbdurable (see recording.Origins).
    session.steps.origins.prune(session.user_ns)
