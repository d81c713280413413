"""``%%step`` and ``%step``: parse arguments, make one call, turn errors into UsageError."""

from __future__ import annotations

import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from .. import commands, events
from ..errors import LeaseHeld, StoreError, UsageProblem
from ..identity import keys, locate
from .session import SubIndex, get_session

USAGE = """\
%%step [NAME] [--force]     record this cell as a step (replayed on rerun)
%step list                   every step of the run and its state
%step clear NAME [NAME ...]  forget steps (and their sub-steps); --all for the whole run
%step pin NAME | unpin NAME  replay a step even when invalidated / stop doing so
%step run [NAME]             switch to a named run (no NAME: the notebook's own run)
%step panel                  show the step panel
%step takeover               take the run's lease from another (stuck) runner"""

_SUBCOMMANDS = locate.STEP_COMMANDS


@magics_class
class StepMagics(Magics):
    """The ``step`` line and cell magic."""

    @line_cell_magic
    def step(self, line: str = "", cell: str | None = None) -> None:
        """Record a cell as a durable step, or manage the run's steps (``%step list``)."""
        __tracebackhide__ = True
        try:
            if cell is None:
                self._line(line)
            else:
                self._cell(line, cell)
        except (UsageProblem, StoreError, LeaseHeld) as exc:
            # One line, no traceback: each message already says what to do.
            raise UsageError(keys.one_line(" ".join(str(exc).split()))) from None

    def _cell(self, line: str, cell: str) -> None:
        __tracebackhide__ = True
        name, force = locate.parse_step_line(line)
        get_session(self.shell).run_step(cell, name=name, force=force)

    def _line(self, line: str) -> None:
        args = _split(line)
        if not args:
            known = ", ".join(_SUBCOMMANDS)
            raise UsageProblem(f"%step needs a command: {known} (see %step?)")
        cmd, rest = args[0], args[1:]
        session = get_session(self.shell)
        if cmd == "list":
            _no_args(cmd, rest)
            infos = commands.step_infos(
                session.store, session.run_id, session.notebook, session.status
            )
            print(f"run {session.run_id!r} in {session.store.path}")
            print(commands.format_table(infos) if infos else "no steps recorded yet")
        elif cmd == "clear":
            self._clear(session, rest)
        elif cmd in ("pin", "unpin"):
            if not rest:
                raise UsageProblem(f"%step {cmd} needs a step NAME (see %step list)")
            for key in commands.resolve(session.store, session.run_id, rest, session.notebook):
                commands.set_pin(session.store, session.run_id, key, cmd == "pin")
                events.emit("store-changed", session.run_id, key, action=cmd)
            print(f"{cmd}ned: {', '.join(rest)}")
        elif cmd == "run":
            if len(rest) > 1:
                raise UsageProblem(f"%step run takes one NAME, got {len(rest)}")
            name = keys.validate_name(rest[0], "run name") if rest else None
            print(f"nbdurable run: {session.set_run(name)!r}")
        elif cmd == "takeover":
            _no_args(cmd, rest)
            previous = session.claim(takeover=True)
            who = f" from {previous.describe()}" if previous else ""
            print(f"this kernel now holds run {session.run_id!r}{who}")
        elif cmd == "panel":
            _no_args(cmd, rest)
            from .panel import panel

            panel().show()
        else:
            known = ", ".join(_SUBCOMMANDS)
            raise UsageProblem(f"%step: unknown command {keys._shown(cmd)}; commands: {known}")

    def _clear(self, session, rest: list[str]) -> None:  # noqa: ANN001
        if rest == ["--all"]:
            n = commands.clear_all(session.store, session.run_id)
            session.status.clear()
            events.emit("store-changed", session.run_id, None, action="clear-all")
            print(f"cleared run {session.run_id!r} ({n} records)")
            return
        if not rest or any(a.startswith("-") for a in rest):
            raise UsageProblem("usage: %step clear NAME [NAME ...] or %step clear --all")
        infos = {i.key: i.label for i in commands.step_infos(session.store, session.run_id)}
        found = commands.resolve(session.store, session.run_id, rest, session.notebook)
        stale = commands.clear(session.store, session.run_id, found)
        for key in found:
            session.status.pop(key, None)
            events.emit("store-changed", session.run_id, key, action="clear")
        msg = f"cleared: {', '.join(rest)}"
        if stale:
            msg += f"; invalidated dependants: {', '.join(infos.get(k, k) for k in stale)}"
        print(msg)


def _split(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise UsageProblem(f"%step: cannot parse arguments ({exc})") from None


def _no_args(cmd: str, rest: list[str]) -> None:
    if rest:
        raise UsageProblem(f"%step {cmd} takes no arguments, got {keys._shown(' '.join(rest))}")


def load(ipython) -> None:  # noqa: ANN001
    """Register the magics and the per-cell hook."""
    ipython.register_magics(StepMagics)
    ipython.events.register("pre_run_cell", _pre_run_cell)


def unload(ipython) -> None:  # noqa: ANN001
    """Unregister the per-cell hook (magics are replaced on the next load)."""
    try:
        ipython.events.unregister("pre_run_cell", _pre_run_cell)
    except ValueError:
        pass
    get_session().run_index = None  # nothing resets it per cell any more


def _pre_run_cell(info: object = None) -> None:
    session = get_session()
    session.cell_ordinals.clear()
    session.run_index = SubIndex()  # the run scope's records are read afresh per cell
