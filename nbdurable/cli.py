"""The ``nbdurable`` command (also ``python -m nbdurable``).

Options shared by several commands are defined once, as parent parsers.
Heavy modules (nbclient, the store, IPython) are imported inside the
command that needs them, so ``nbdurable --help`` and the inspection
commands start fast. Exit codes: 0 success, 1 a notebook cell raised (or
``check`` left a problem), 2 bad usage (one line on stderr, never a
traceback), 3 the kernel died more than ``--retries`` times, 4 another live
kernel records into the run, 5 a cell timed out, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, naming the way to get help."""

    def error(self, message: str) -> NoReturn:
        from .text import one_line

        message = one_line(message)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parents() -> dict[str, argparse.ArgumentParser]:
    """The options several commands share, each defined once."""

    def parent() -> argparse.ArgumentParser:
        return _Parser(add_help=False)

    notebook = parent()
    notebook.add_argument(
        "notebook",
        metavar="NOTEBOOK.ipynb",
        type=Path,
        help="the notebook (its store is NBDURABLE_DIR or .nbdurable/ beside it)",
    )
    run = parent()
    run.add_argument(
        "--run",
        metavar="NAME",
        dest="run_name",
        help="a named run (as set by `%%step run NAME`) instead of the notebook's own",
    )
    store = parent()
    store.add_argument(
        "--store",
        metavar="DIR_OR_URL",
        help="the store: a directory, or postgresql://user@host/db?namespace=NAME for a "
        "team store (default: NBDURABLE_STORE, else NBDURABLE_DIR, else .nbdurable/ "
        "beside the notebook, else in the working directory)",
    )
    as_json = parent()
    as_json.add_argument("--json", action="store_true", help="print JSON for scripts")
    quiet = parent()
    quiet.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress and no summary; errors still go to stderr",
    )
    return {"notebook": notebook, "run": run, "store": store, "json": as_json, "quiet": quiet}


def _exit_codes() -> str:
    # Kept in step with nbdurable.run.result.EXIT_CODES by a test; not imported,
    # so that `nbdurable --help` stays fast.
    return (
        "Exit codes: 0 ok; 1 a cell raised (or `check` left a problem); 2 bad usage; "
        "3 the kernel died more than --retries times; 4 another live kernel records into "
        "the run (see --takeover); 5 a cell ran longer than --timeout; 6 verify: a step or "
        "call would have run live; 7 stopped at an approval waiting for a decision "
        "(see `nbdurable approvals`); 130 interrupted."
    )


def _kernel_options(parser: argparse.ArgumentParser, written: str) -> None:
    """The options of a command that executes the notebook (``run``, ``verify``)."""
    parser.add_argument(
        "-o",
        "--output",
        metavar="OUT.ipynb",
        type=Path,
        help=f"write the executed notebook here (default: {written})",
    )
    parser.add_argument(
        "--timeout", metavar="S", type=_seconds, help="per-cell timeout in seconds (default: none)"
    )
    parser.add_argument(
        "--cwd",
        metavar="DIR",
        type=Path,
        help="the kernel's working directory (default: the notebook's directory)",
    )
    parser.add_argument(
        "--kernel", metavar="NAME", help="kernel spec to use (default: the notebook's)"
    )


def _live_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--live",
        metavar="PATTERN",
        action="append",
        help="run the sub-steps whose ids match PATTERN (a glob, e.g. 'llm:*'; repeatable) "
        "live while the rest replay, recorded into a fork of the run (see --into)",
    )
    parser.add_argument(
        "--into",
        metavar="NAME",
        help="with --live: the fork to record into (default: RUN-live-DATE)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The full ``nbdurable`` argument parser."""
    p = _parents()
    parser = _Parser(
        prog="nbdurable",
        description="Durable execution for Jupyter notebooks: run, resume and inspect.",
        epilog="Start with `nbdurable demo`. " + _exit_codes(),
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"nbdurable {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    run = sub.add_parser(
        "run",
        parents=[p["notebook"], p["run"], p["store"], p["json"], p["quiet"]],
        help="execute a notebook durably; restart a dead kernel and resume",
        description="Execute NOTEBOOK in a real kernel. When the kernel dies, start a new one "
        "and run again from the top: recorded steps replay, only unfinished work runs. The "
        "notebook file is written back only when the run produced results (it completed, or "
        "a cell raised or timed out).",
        epilog=_exit_codes(),
    )
    _kernel_options(run, written="in place")
    run.add_argument(
        "--retries",
        metavar="N",
        type=_count,
        default=3,
        help="kernel deaths to survive (default: 3)",
    )
    run.add_argument(
        "--takeover",
        action="store_true",
        help="take the run's lease even if another live kernel holds it",
    )
    _live_option(run)
    run.set_defaults(func=cmd_run)

    verify = sub.add_parser(
        "verify",
        parents=[p["notebook"], p["run"], p["store"], p["json"], p["quiet"]],
        help="run a notebook replay-only: fail if any step or call would run live",
        description="Execute NOTEBOOK in a real kernel that may only replay: every step must "
        "replay (or rerun its body with every sub-step and HTTP request from the record), and "
        "anything that would run live (a step with no record or an invalidated one, a new "
        "sub-step id, an unrecorded request, a diverged argument) stops the run with one line "
        "naming it and exit code 6. No network and no keys needed; the notebook file is not "
        "written (-o writes the executed copy).",
        epilog=_exit_codes(),
    )
    _kernel_options(verify, written="not written")
    _live_option(verify)
    verify.set_defaults(func=cmd_verify)

    fork = sub.add_parser(
        "fork",
        parents=[p["notebook"], p["run"], p["store"]],
        help="a new run that shares a run's records before a step",
        description="Make run NEW from the notebook's run (or --run NAME): the records of the "
        "steps before STEP (every step without --from) are shared, so they replay in NEW with "
        "no call made, and STEP and the steps after it run anew there. Saved values are not "
        "copied; the parent is never written. Then `nbdurable run NOTEBOOK --run NEW`.",
    )
    fork.add_argument("new_run", metavar="NEW", help="the new run's name")
    fork.add_argument("--from", dest="from_step", metavar="STEP", help="the first step to redo")
    fork.set_defaults(func=cmd_fork)

    diff = sub.add_parser(
        "diff",
        parents=[p["notebook"], p["store"], p["json"]],
        help="compare two runs of a notebook step by step",
        description="Compare two runs of NOTEBOOK (its own run, by the id `nbdurable ls` "
        "shows, or named runs: `%%step run NAME`, `--run NAME`) step by step, from the "
        "store alone: which steps differ and how (code, inputs, outputs as a text diff, "
        "variables, sub-steps), with each run's time, calls and tokens. Exit 0 whether or "
        "not they differ.",
    )
    diff.add_argument("run_a", metavar="RUN_A", help="the first run")
    diff.add_argument("run_b", metavar="RUN_B", help="the second run")
    diff.add_argument("--step", metavar="NAME", help="compare only this step")
    diff.set_defaults(func=cmd_diff)

    status = sub.add_parser(
        "status",
        parents=[p["notebook"], p["run"], p["store"], p["json"]],
        help="every %%%%step cell and its state (starts no kernel)",
        description="Every %%step cell of NOTEBOOK in notebook order with its state: "
        "recorded, pending, invalidated, pinned, failed. Reads the notebook file "
        "and the store; starts no kernel.",
    )
    status.add_argument(
        "--why",
        metavar="STEP",
        help="say what the next run does with STEP and why: the input that changed with "
        "its old and new value, the lines of code, the files",
    )
    status.set_defaults(func=cmd_status)

    clear = sub.add_parser(
        "clear",
        parents=[p["notebook"], p["run"], p["store"]],
        help="forget steps (their sub-steps too), like %%step clear",
        description="Forget steps: their records, states and sub-steps; steps that read "
        "their variables are marked stale. Same as `%step clear`.",
    )
    clear.add_argument("steps", metavar="STEP", nargs="*", help="step names (or labels, keys)")
    clear.add_argument("--all", action="store_true", help="forget the whole run, pins included")
    clear.set_defaults(func=cmd_clear)

    for name, verb in (
        ("pin", "replay a step even when invalidated"),
        ("unpin", "stop pinning a step"),
    ):
        pin = sub.add_parser(
            name,
            parents=[p["notebook"], p["run"], p["store"]],
            help=verb,
            description=f"{verb[0].upper()}{verb[1:]}; same as `%step {name}`.",
        )
        pin.add_argument("steps", metavar="STEP", nargs="+", help="step names (or labels, keys)")
        pin.set_defaults(func=cmd_pin, pinned=name == "pin")

    approvals = sub.add_parser(
        "approvals",
        parents=[p["notebook"], p["run"], p["store"], p["json"]],
        help="the approvals waiting for a decision (starts no kernel)",
        description="The approvals of the run that wait for a decision (asked by approve() "
        "or @recorded(approve=True)), the longest waiting first: id, step, when asked, "
        "summary and details.",
    )
    approvals.set_defaults(func=cmd_approvals)
    for name, verb in (("approve", "approve"), ("reject", "reject")):
        decide = sub.add_parser(
            name,
            parents=[p["notebook"], p["run"], p["store"]],
            help=f"{verb} a pending approval; the next run continues from it",
            description=f"{verb.capitalize()} the pending approval ID (as `nbdurable approvals` "
            "lists it; STEP/ID where two steps use the same id). The decision is recorded "
            "with who made it (user@host, the host NBDURABLE_HOST or this machine's name) "
            "and when; the next `nbdurable run` replays what came before and goes on.",
        )
        decide.add_argument("approval", metavar="ID", help="the approval's id")
        decide.add_argument("--reason", default="", help="why (recorded with the decision)")
        decide.set_defaults(func=cmd_decide, approved=name == "approve")

    export = sub.add_parser(
        "export",
        parents=[p["notebook"], p["run"], p["store"]],
        help="the run's log as JSON: steps, sub-steps, timings, fingerprints",
        description="Print the run's log: steps in notebook order and their sub-steps in call "
        "order, with ids, timings, sizes and fingerprints.",
    )
    export.add_argument(
        "--format",
        choices=("json", "jsonl"),
        default="json",
        help="one JSON document (default) or JSON lines",
    )
    export.add_argument(
        "--values",
        action="store_true",
        help="include recorded values JSON can represent (others as type+repr)",
    )
    export.set_defaults(func=cmd_export)

    ls = sub.add_parser(
        "ls",
        parents=[p["store"], p["json"]],
        help="the runs in a store",
        description="The runs in a store, with step "
        "counts, size and last activity, most recent first.",
    )
    ls.set_defaults(func=cmd_ls)

    gc = sub.add_parser(
        "gc",
        parents=[p["store"], p["json"]],
        help="remove old runs (never pinned steps)",
        description="Remove runs idle for longer than --older-than, except their pinned steps; "
        "then saved variables no step uses any more. Run it while no kernel records "
        "to the store.",
    )
    gc.add_argument(
        "--older-than",
        metavar="AGE",
        default="30d",
        help="idle time, e.g. 30d, 12h, 90m (default: 30d)",
    )
    gc.add_argument(
        "--keep-versions",
        metavar="N",
        type=_keep_versions,
        default=None,
        help="versions (code and inputs) of each step to keep, the current one included "
        "(default: 10); pinned steps keep every version",
    )
    gc.add_argument("--dry-run", action="store_true", help="report what would go; change nothing")
    gc.set_defaults(func=cmd_gc)

    check = sub.add_parser(
        "check",
        parents=[p["store"], p["json"]],
        help="check a store's records and files; repair what can be",
        description="Check the store of NOTEBOOK (or --store DIR_OR_URL): the database's "
        "integrity, every record's value file, files no record points to. Repairs what can be "
        "(a record whose value file is lost or truncated is removed: its step runs again; an "
        "orphan file is removed) and says what it found and what it repaired. Exit 1 if a "
        "problem remains. "
        "Run it while no kernel records to the store.",
    )
    check.add_argument(
        "notebook",
        metavar="NOTEBOOK.ipynb",
        type=Path,
        nargs="?",
        help="the notebook whose store to check (default: NBDURABLE_DIR, else ./.nbdurable)",
    )
    check.add_argument(
        "--dry-run", action="store_true", help="report what is wrong; repair nothing"
    )
    check.set_defaults(func=cmd_check)

    copy = sub.add_parser(
        "copy",
        help="copy a run to another store (a directory or a postgresql:// URL)",
        description="Copy RUN (as `nbdurable ls` names it) from --from to --to, verifying "
        "every record and saved variable; records are re-signed with the destination's key "
        "and written in one transaction: all of the run or none of it.",
    )
    copy.add_argument("run_id", metavar="RUN", help="the run, as `nbdurable ls` shows it")
    copy.add_argument("--to", metavar="DIR_OR_URL", required=True, help="the destination store")
    copy.add_argument(
        "--from",
        dest="store",
        metavar="DIR_OR_URL",
        help="the source store (default: NBDURABLE_STORE, else NBDURABLE_DIR, else "
        ".nbdurable/ in the working directory)",
    )
    copy.set_defaults(func=cmd_copy)

    demo = sub.add_parser(
        "demo",
        parents=[p["json"], p["quiet"]],
        help="run the research agent, kill its kernel at sub-question 40, resume",
        description="Run the bundled 60-question research-agent notebook with a simulated, "
        "offline model and search; kill its kernel for real during sub-question "
        "--crash-at; resume with `nbdurable run`; compare what each attempt spent.",
    )
    demo.add_argument(
        "--crash-at",
        metavar="N",
        type=_count,
        default=40,
        help="sub-question (0-59) whose answer call kills the kernel (default: 40)",
    )
    demo.add_argument(
        "--dir", metavar="DIR", type=Path, help="where to work (default: a new temporary directory)"
    )
    demo.add_argument(
        "--latency",
        metavar="S",
        type=_latency,
        default=None,
        help="simulated seconds per model/search call (default: 0.03)",
    )
    demo.add_argument(
        "--store",
        metavar="DIR_OR_URL",
        help="record the demo there, in a run of its own: a directory, or "
        "postgresql://user@host/db for a team store (with NBDURABLE_KEY, in the URL's "
        "namespace; without, signed with a public demo key in namespace nbdurable_demo)",
    )
    demo.set_defaults(func=cmd_demo)
    return parser


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number 0 or more, got {text!r}")
    return value


def _keep_versions(text: str) -> int:
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number 1 or more, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _latency(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 10:
        raise argparse.ArgumentTypeError(f"expected seconds between 0 and 10, got {text!r}")
    return value


# -- shared plumbing ---------------------------------------------------------------


def _notebook(args: argparse.Namespace) -> Path:
    """The notebook argument, checked: it exists and is notebook JSON."""
    from .run.notebook import check_path

    return check_path(args.notebook)


def _path(path: Path) -> Path:
    try:
        return path.expanduser().absolute()
    except RuntimeError:  # `~user` of no such user
        raise _usage(f"cannot expand {str(path)!r}: no such user's home directory") from None


def _is(test: Any) -> bool:
    try:
        return bool(test())
    except OSError:  # e.g. a name too long for the file system: no such file
        return False


def _usage(message: str) -> Exception:
    from .errors import UsageProblem

    return UsageProblem(message)


def _store_dir(args: argparse.Namespace, notebook: Path | None) -> Any:
    """The store: ``--store``, else NBDURABLE_STORE, else the directory (a Path or a URL)."""
    from . import config
    from .identity.locate import store_dir
    from .store import opener

    given = getattr(args, "store", None)
    if given is not None:
        return given if opener.is_url(given) else _path(Path(given))
    return config.chosen_store(store_dir(notebook))


def _shown(target: Any) -> str:
    """A store as printed: a URL without its password."""
    from .store import opener

    if opener.is_url(target):
        from .store.postgres import display

        return display(target)
    return str(target)


def _open(directory: Path, must_exist: bool = True) -> Any:
    """The store at ``directory``; None if it does not exist and ``must_exist`` is false."""
    from .store import open_store, opener

    if not _is(lambda: opener.exists(directory)):
        if must_exist:
            raise _usage(
                f"no nbdurable store at {_shown(directory)}; pass --store DIR or set "
                "NBDURABLE_DIR to the directory that holds the runs"
            )
        return None
    return open_store(directory)


def _run_id(args: argparse.Namespace, notebook: Path, store: Any, directory: Path) -> str:
    """The run the command works on; a named run must exist."""
    if args.run_name is None:
        from .identity.locate import run_id_for, store_dir
        from .store import opener

        # A shared store: run ids are relative to the local directory (see store.opener).
        return run_id_for(notebook, store_dir(notebook) if opener.is_url(directory) else directory)
    from .identity.keys import validate_name
    from .store import admin

    validate_name(args.run_name, "run name")
    if store is None or not admin.known_run(store, args.run_name):
        known = ", ".join(repr(r) for r in admin.run_names(store)) if store else "none"
        raise _usage(
            f"no run {args.run_name!r} in the store at {_shown(directory)} (runs: {known})"
        )
    return args.run_name


def _emit(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def _when(t: float | None) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


# -- commands --------------------------------------------------------------------------


def _live_fork(args: argparse.Namespace) -> dict[str, str]:
    """With ``--live``: fork the run into ``--into`` and record there; the kernel's env."""
    if args.into is not None and not args.live:
        raise _usage("--into names the fork --live records into; give --live PATTERN too")
    if not args.live:
        return {}
    import time

    from . import commands
    from .identity.keys import validate_name

    patterns = [p.strip() for p in args.live]
    if not all(patterns) or any("," in p for p in patterns):
        raise _usage("--live takes one non-empty pattern at a time, without commas (repeat it)")
    with _recorded_run(args) as (notebook, store, run_id, _):
        new = args.into or f"{run_id}-live-{time.strftime('%Y%m%d-%H%M%S')}"
        validate_name(new, "run name (--into)")
        done = commands.fork(store, run_id, new, notebook)
    print(done.message, file=sys.stderr)
    args.run_name = new
    return {"NBDURABLE_LIVE": ",".join(patterns)}


def cmd_run(args: argparse.Namespace) -> int:
    """``nbdurable run``."""
    from .run import ConsoleProgress, Progress, run_notebook

    if args.run_name is not None:
        from .identity.keys import validate_name

        validate_name(args.run_name, "run name")
    live_env = _live_fork(args)
    quiet = args.quiet or args.json
    result = run_notebook(
        args.notebook,
        output=args.output,
        retries=args.retries,
        run_name=args.run_name,
        timeout=args.timeout,
        cwd=args.cwd,
        kernel=args.kernel,
        store=args.store,
        progress=Progress() if quiet else ConsoleProgress(),
        takeover=args.takeover,
        env=live_env,
    )
    if args.json:
        _emit(result.to_json())
    if result.status == "pending approval":
        print(f"nbdurable run: {_approval_line(args, result)}", file=sys.stderr)
    elif result.status == "lease held":
        assert result.error is not None
        print(
            f"nbdurable run: {result.error.evalue.strip().rstrip('.')}; "
            "the notebook file was not changed",
            file=sys.stderr,
        )
    elif result.error is not None:
        err = result.error
        text = err.message if sys.stderr.isatty() else _strip_ansi(err.message)
        print(text.rstrip(), file=sys.stderr)
        where = f"cell #{err.index + 1}"
        if err.label != where:
            where += f" (step {err.label!r})"
        what = (
            f"timed out (--timeout {args.timeout})"
            if err.ename == "CellTimeoutError"
            else f"raised {err.ename}"
        )
        hint = ""
        if err.ename == "UsageError" and "magic `%%step` not found" in err.evalue:
            hint = "; add `%load_ext nbdurable` in a cell before the first %%step"
        print(
            f"nbdurable run: {where} {what}{hint}; the executed notebook is in {result.output}",
            file=sys.stderr,
        )
    elif result.interrupted:
        print("nbdurable run: interrupted; the notebook file was not changed", file=sys.stderr)
    elif result.status == "kernel died":
        last = result.attempts[-1]
        where = "before the first cell" if last.died_in is None else f"in cell #{last.died_in + 1}"
        times = f"{result.deaths} time{'' if result.deaths == 1 else 's'}"
        print(
            f"nbdurable run: error: the kernel died {times}, more than "
            f"--retries {result.retries} allows (last {where}); fix the crash or raise "
            "--retries, then run again: recorded steps replay. The notebook file was not changed",
            file=sys.stderr,
        )
    return result.exit_code


def _approval_line(args: argparse.Namespace, result: Any) -> str:
    """The one line of a run that stopped at an approval: which, and how to decide it."""
    import shlex

    err = result.error
    if not result.approvals:  # the store could not be read: the kernel's own line
        return f"stopped: {err.evalue.strip()}" if err else "stopped at an approval"
    last = result.approvals[-1]
    where = f" of step {last['step']!r}" if last["step"] else ""
    more = len(result.approvals) - 1
    options = "".join(
        f" {flag} {shlex.quote(str(value))}"
        # A URL is shown without its password, as every command shows a store.
        for flag, value in (
            ("--run", args.run_name),
            ("--store", _shown(args.store) if args.store is not None else None),
        )
        if value is not None
    )
    target = f"{shlex.quote(str(args.notebook))}{options}"
    ident = shlex.quote(last["id"])
    return (
        f"stopped at approval {last['id']!r}{where}, waiting for a decision: {last['summary']}"
        f"{f' ({more} more pending: nbdurable approvals)' if more > 0 else ''}; "
        f"decide with `nbdurable approve {target} {ident}` or "
        f"`nbdurable reject {target} {ident} --reason ...`, then run again (exit 7)"
    )


def cmd_verify(args: argparse.Namespace) -> int:
    """``nbdurable verify``: ``run`` replay-only, with no retry and no write."""
    from .run import ConsoleProgress, Progress, run_notebook

    if args.run_name is not None:
        from .identity.keys import validate_name

        validate_name(args.run_name, "run name")
    live_env = _live_fork(args)
    quiet = args.quiet or args.json
    result = run_notebook(
        args.notebook,
        output=args.output,
        retries=0,
        run_name=args.run_name,
        timeout=args.timeout,
        cwd=args.cwd,
        kernel=args.kernel,
        store=args.store,
        progress=Progress() if quiet else ConsoleProgress(command="verify"),
        verify=True,
        env=live_env,
    )
    if args.json:
        _emit(result.to_json())
    unchanged = "the notebook file was not changed"
    if result.status == "refused":
        for line in result.refused:
            print(f"nbdurable {line}", file=sys.stderr)
        n = len(result.refused)
        print(
            f"nbdurable verify: failed: {n} thing{'' if n == 1 else 's'} would have run live; "
            f"record them with `nbdurable run` first; {unchanged}",
            file=sys.stderr,
        )
    elif result.status == "ok":
        from .text import plural

        saved, steps = result.saved or {}, result.steps
        reran = steps.get("executed", 0)  # bodies that ran again, every call from the record
        if not quiet:
            replayed = plural(steps.get("replayed", 0), "step")
            bodies = f"{reran} {'body' if reran == 1 else 'bodies'}"
            calls = plural(int(saved.get("calls", 0)), "call")
            print(
                f"nbdurable verify: ok: nothing ran live ({replayed} replayed, {bodies} ran "
                f"again from the record, {calls} replayed)"
            )
    elif result.error is not None:
        err = result.error
        text = err.message if sys.stderr.isatty() else _strip_ansi(err.message)
        print(text.rstrip(), file=sys.stderr)
        print(
            f"nbdurable verify: cell #{err.index + 1} raised {err.ename}; {unchanged}",
            file=sys.stderr,
        )
    elif result.interrupted:
        print(f"nbdurable verify: interrupted; {unchanged}", file=sys.stderr)
    elif result.status == "kernel died":
        print(f"nbdurable verify: failed: the kernel died; {unchanged}", file=sys.stderr)
    return result.exit_code


def cmd_fork(args: argparse.Namespace) -> int:
    """``nbdurable fork``."""
    from . import commands

    with _recorded_run(args) as (notebook, store, run_id, _):
        done = commands.fork(store, run_id, args.new_run, notebook, args.from_step)
    print(done.message)
    print(f"next: nbdurable run {_shown(notebook)} --run {args.new_run}")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    """``nbdurable diff``."""
    from . import rundiff as compare
    from .text import plural

    notebook = _notebook(args)
    directory = _store_dir(args, notebook)
    store = _open(directory, must_exist=False)
    if store is None:
        raise _usage(f"no store at {_shown(directory)}; run the notebook first")
    with store:
        compare.check_runs(store, args.run_a, args.run_b)
        rows = compare.diff_runs(store, args.run_a, args.run_b, notebook, args.step)
    if args.step is not None and not rows:
        raise _usage(f"neither run recorded a step {args.step!r}")
    if args.json:
        _emit(compare.to_json(args.run_a, args.run_b, rows))
        return 0
    differ = [r for r in rows if r.verdict != "same"]
    print(
        f"A = {args.run_a!r}, B = {args.run_b!r}: {plural(len(rows), 'step')}, {len(differ)} differ"
    )

    def side(seconds: float, calls: int, tokens: int | None = None) -> str:
        said = f"{seconds:.1f} s, {plural(int(calls), 'call')}"
        return said if tokens is None else f"{said}, {plural(int(tokens), 'token')}"

    for r in rows:
        cell = f"cell {r.cell}" if r.cell is not None else "no cell"
        times = f"A {side(r.a.seconds, r.a.calls)} · B {side(r.b.seconds, r.b.calls)}"
        print(f"{'=' if r.verdict == 'same' else '≠'} {r.label} ({cell}): {r.verdict} · {times}")
        for line in r.lines:
            print(f"    {line}")
    t = compare.totals(rows)
    a, b = t["a"], t["b"]
    print(
        f"total: A {side(a['seconds'], a['calls'], a['tokens'])} · "
        f"B {side(b['seconds'], b['calls'], b['tokens'])}"
    )
    return 0


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)


def cmd_status(args: argparse.Namespace) -> int:
    """``nbdurable status``."""
    from . import status

    notebook = _notebook(args)
    directory = _store_dir(args, notebook)
    # A store named with --store must be there: a mistyped path is not "all pending".
    store = _open(directory, must_exist=getattr(args, "store", None) is not None)
    if store is None:
        run_id = _run_id(args, notebook, None, directory)
        infos = status.pending_infos(notebook)
    else:
        with store:
            run_id = _run_id(args, notebook, store, directory)
            infos = status.step_infos(store, run_id, notebook)
            if args.why is not None:
                from .commands import resolve

                key = resolve(store, run_id, [args.why], notebook, infos)[0]
                infos = [i for i in infos if i.key == key]
    if args.why is not None and store is None:
        raise _usage(f"nothing is recorded for {notebook.name} yet: every step runs")
    if args.why is not None:
        if args.json:
            _emit(infos[0].to_json())
        else:
            print(status.why_text(infos[0]))
        return 0
    if args.json:
        _emit(
            {
                "notebook": str(notebook),
                "run": run_id,
                "store": _shown(directory),
                "steps": [i.to_json() for i in infos],
            }
        )
        return 0
    print(f"{notebook.name} · run {run_id!r} · store {_shown(directory)}")
    print(status.format_table(infos) if infos else "no %%step cells and nothing recorded")
    return 0


@contextmanager
def _recorded_run(args: argparse.Namespace) -> Iterator[tuple[Path, Any, str, Path]]:
    """``(notebook, store, run id, store dir)`` of a run that has records; closes the store."""
    notebook = _notebook(args)
    directory = _store_dir(args, notebook)
    store = _open(directory, must_exist=False)
    if store is None:
        raise _usage(
            f"nothing is recorded for {notebook.name} yet (no store at {_shown(directory)}); "
            "run it first"
        )
    with store:
        yield notebook, store, _run_id(args, notebook, store, directory), directory


def cmd_clear(args: argparse.Namespace) -> int:
    """``nbdurable clear``."""
    from . import commands

    if args.all == bool(args.steps):
        raise _usage("give step names to clear, or --all for the whole run (not both)")
    with _recorded_run(args) as (notebook, store, run_id, _):
        if args.all:
            done = commands.clear_run(store, run_id)
        else:
            done = commands.clear_steps(store, run_id, args.steps, notebook)
    print(done.message)
    return 0


def cmd_pin(args: argparse.Namespace) -> int:
    """``nbdurable pin`` / ``unpin``."""
    from . import commands

    with _recorded_run(args) as (notebook, store, run_id, _):
        done = commands.pin_steps(store, run_id, args.steps, notebook, pinned=args.pinned)
    print(done.message)
    return 0


def cmd_approvals(args: argparse.Namespace) -> int:
    """``nbdurable approvals``."""
    from . import approvals

    with _recorded_run(args) as (notebook, store, run_id, _):
        waiting = approvals.pending(store, run_id)
    if args.json:
        _emit([p.to_header() for p in waiting])
        return 0
    if not waiting:
        print(f"no approval of run {run_id!r} waits for a decision")
        return 0
    for p in waiting:
        print(f"{p.id}  ({p.step or 'outside any step'}, asked {_when(p.asked)} on {p.asked_on})")
        print(f"    {p.summary}")
        for line in p.details.splitlines():
            print(f"    | {line}")
        if p.again:
            print(f"    asked again: {p.again}")
    print(f"decide with `nbdurable approve {notebook.name} ID` or `nbdurable reject ... --reason`")
    return 0


def cmd_decide(args: argparse.Namespace) -> int:
    """``nbdurable approve`` / ``reject``."""
    from . import commands

    with _recorded_run(args) as (_, store, run_id, _dir):
        done = commands.decide(store, run_id, args.approval, args.approved, args.reason)
    print(done.message)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """``nbdurable export``."""
    from . import status
    from .store import admin

    with _recorded_run(args) as (notebook, store, run_id, directory):
        if args.run_name is None and not admin.known_run(store, run_id):
            raise _usage(
                f"nothing is recorded for run {run_id!r} in {_shown(directory)}; "
                "run the notebook first"
            )
        rows = status.step_infos(store, run_id, notebook)
        doc = admin.export_run(store, run_id, rows, notebook, with_values=args.values)
    if args.format == "json":
        _emit(doc)
    else:
        for line in admin.export_lines(doc):
            print(json.dumps(line, default=str))
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    """``nbdurable ls``."""
    from .store import admin
    from .text import human_size

    directory = _store_dir(args, None)
    with _open(directory) as store:
        infos = admin.list_runs(store)
    if args.json:
        _emit({"store": _shown(directory), "runs": [r.to_json() for r in infos]})
        return 0
    print(f"store {_shown(directory)}: {len(infos)} run{'s' if len(infos) != 1 else ''}")
    rows = [("run", "steps", "sub-steps", "pinned", "size", "last activity", "forked from")]
    rows += [
        (
            r.run,
            str(r.steps),
            str(r.substeps),
            str(r.pinned),
            human_size(r.size),
            _when(r.last),
            r.parent or "-",
        )
        for r in infos
    ]
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    """``nbdurable gc``."""
    from .store import admin, versions
    from .text import human_size

    age = admin.parse_age(args.older_than)
    directory = _store_dir(args, None)
    with _open(directory) as store:
        keep = args.keep_versions or versions.KEEP_VERSIONS
        report = admin.gc(store, age, dry_run=args.dry_run, keep_versions=keep)
    if args.json:
        _emit(report.to_json())
        return 0
    verb = "would remove" if args.dry_run else "removed"
    print(
        f"{verb} {report.keys} records ({human_size(report.bytes)}) of runs idle since "
        f"{_when(report.cutoff)}, and {report.blobs} unused saved variables "
        f"({human_size(report.blob_bytes)})"
    )
    if report.versions:
        print(f"  {verb} {report.versions} earlier versions of steps (beyond {keep} per step)")
    for name in report.removed_runs:
        print(f"  {verb} run {name!r}")
    for name, steps in report.kept_pinned.items():
        print(f"  kept pinned steps of run {name!r}: {', '.join(steps)}")
    for note in report.notes:
        print(f"  note: {note}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """``nbdurable check``."""
    from .errors import DamagedDatabase
    from .store import admin

    notebook = _notebook(args) if args.notebook is not None else None
    directory = _store_dir(args, notebook)
    try:
        with _open(directory) as store:
            report = admin.check(store, fix=not args.dry_run)
    except DamagedDatabase as exc:
        report = admin.CheckReport(str(directory), args.dry_run, [str(exc)])
        if not args.dry_run:
            from .store import open_store

            kept = admin.set_aside(Path(exc.db_file))
            with open_store(directory) as store:  # a new, empty database, under the same key
                report = admin.check(store, fix=True)
            report.found.insert(
                0,
                f"the database {exc.db_file} could not be read, or had lost its records: "
                f"kept as {kept} and started afresh; what it held is lost (every step "
                "runs again, or restore the store from a backup)",
            )
    if args.json:
        _emit(report.to_json())
    else:
        print(report.text())
    return 0 if not report.left else 1


def cmd_copy(args: argparse.Namespace) -> int:
    """``nbdurable copy``."""
    from .store import opener
    from .store.copy import copy_run
    from .text import human_size

    source = _store_dir(args, None)
    dest = args.to if opener.is_url(args.to) else _path(Path(args.to))
    with _open(source) as src, opener.open_store(dest) as dst:
        report = copy_run(src, dst, args.run_id)
    print(
        f"copied run {args.run_id!r}: {report.records} records and {report.blobs} saved "
        f"variables ({human_size(report.blob_bytes)} new) from {_shown(source)} to {_shown(dest)}"
    )
    if report.missing:
        print(f"  note: {len(report.missing)} saved variables were already missing at the source")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """``nbdurable demo``."""
    from .demo import run_demo

    return run_demo(
        crash_at=args.crash_at,
        directory=args.dir,
        latency=args.latency,
        as_json=args.json,
        quiet=args.quiet,
        store=args.store,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``nbdurable`` console script; returns the exit code."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and isinstance(getattr(args, "steps", None), list) and "--" not in extra:
        # argparse gives step names after an option (`clear NB --all plan`) back as
        # unrecognized: they are step names, and the command judges them.
        if not any(e.startswith("-") for e in extra):
            args.steps, extra = [*args.steps, *extra], []
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if any(v == [] for k, v in vars(args).items() if k != "steps"):
        parser.error("an option's value is '--'; give the value itself")  # argparse gives []
    from .errors import NbdurableError
    from .text import one_line

    # jupyter_client imports ipykernel to find the native kernel, and with older
    # ipykernel releases that imports debugpy, which prints a four-line "frozen
    # modules" warning on Python 3.11+ unless told not to validate (its own
    # documented switch). Kernels started from here inherit the setting.
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    try:
        return int(args.func(args))
    except NbdurableError as exc:
        print(f"nbdurable {args.command}: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"nbdurable {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `nbdurable export ... | head`: the reader left; say nothing more.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except OSError as exc:  # a path the command could not use: one line, never a traceback
        where = f": {exc.filename}" if exc.filename else ""
        print(
            f"nbdurable {args.command}: error: {exc.strerror or exc}{where}; "
            "check the path and its permissions",
            file=sys.stderr,
        )
        return EXIT_USAGE
