"""The cell marks' data: every saved ``%%step`` cell of a notebook and its state, with no kernel.

The notebook frontends mark each ``%%step`` cell with its state (the
extension in ``js/``). They ask ``GET /nbdurable/api/steps?path=NOTEBOOK``
(see :mod:`nbdurable.server`), answered by :func:`step_marks` from the same
rows as ``nbdurable status`` and the panel (:func:`nbdurable.status.step_infos`):
one reading of the store, so the marks, the panel and the CLI never disagree.

The answer, as JSON::

    {"run": "<run id>", "store": "<store dir>", "store_exists": true,
     "now": <server time, s>,          # the frontend converts its own clock with it
     "cells": [{"index": 3,            # position of the cell in the saved notebook
                "cell_id": "ab12…",    # saved cell id (null before nbformat 4.5)
                "name": "plan",        # the step's name (null for an unnamed step)
                "body": "…",           # the saved source after the %%step line
                "key": "name:plan", "label": "plan",
                "state": "recorded", "detail": "", "recorded_at": …, "duration": …,
                "substeps": …, "calls": …, "pinned": false, "replayable": true, …}],
     "others": [<rows of steps no longer in the notebook, and of sub-steps outside steps>],
     "approvals": [{"id": "send", "step": "email", "scope": "name:email", "summary": "…",
                    "details": "…", "asked": …, "asked_on": "…", "again": ""}]}

``approvals`` are the run's approvals waiting for a decision (see
:mod:`nbdurable.approvals`), the longest waiting first: what a sidebar lists
for ``nbdurable approve`` (or a button) to decide.

``state`` is what :func:`~nbdurable.status.step_infos` says with no kernel:
recorded, pending, invalidated, pinned, failed, not replayable. What only the
frontend knows (a cell runs now, its last run replayed, its source differs
from the saved one) it adds itself.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .. import approvals, commands, status
from ..errors import UsageProblem
from ..identity import locate
from ..store import open_store, opener

#: What the sidebar's buttons and the cell menu may ask (see :func:`act`).
ACTIONS = ("pin", "unpin", "clear", "clear-all", "approve", "reject")


def step_marks(notebook: Path, store_dir: Path | None = None) -> dict[str, Any]:
    """The state of every saved ``%%step`` cell of ``notebook`` (see the module docstring).

    ``store_dir`` defaults to where a kernel running the notebook records
    (``NBDURABLE_DIR``, else ``.nbdurable/`` beside the notebook). A store that
    does not exist yet is not created: every step is pending. Raises
    :class:`~nbdurable.errors.StoreError` when the store cannot be read.
    """
    notebook = Path(notebook).absolute()
    directory = store_dir if store_dir is not None else locate.store_dir(notebook)
    run_id = locate.run_id_for(notebook, directory)
    exists = opener.exists(directory)
    waiting: list[dict[str, Any]] = []
    if exists:
        with open_store(directory) as store:
            infos = status.step_infos(store, run_id, notebook)
            for p in approvals.pending(store, run_id):
                row = p.to_header()
                for field in ("kind", "run", "args_fp", "parts"):  # internal: not for a view
                    row.pop(field, None)
                waiting.append(row)
    else:
        infos = status.pending_infos(notebook)
    by_key = {i.key: i for i in infos}
    nbf = locate.NotebookFile(notebook)
    nbf.refresh()
    cells: list[dict[str, Any]] = []
    for cell in nbf.cells:
        info = by_key.get(cell.key)
        if info is None:  # the file changed between the two reads: the next poll has it
            continue
        row = info.to_json()
        row.update(index=cell.index, cell_id=cell.cell_id, name=cell.name, body=cell.body)
        cells.append(row)
    in_cells = {c["key"] for c in cells}
    return {
        "run": run_id,
        "store": str(directory),
        "store_exists": exists,
        "now": time.time(),
        "cells": cells,
        "others": [i.to_json() for i in infos if i.key not in in_cells],
        "approvals": waiting,
    }


def runs_of(notebook: Path, store_dir: Path | None = None) -> dict[str, Any]:
    """The runs of the store ``notebook`` records to: the side panel's Runs list.

    ``{"run": <the notebook's run>, "runs": [{"run", "parent", "steps", "last"}]}``,
    most recently active first; ``parent`` is the run a fork was made from.
    Listing reads every run's keys, so the side panel asks only when opened.
    """
    from ..store import admin

    notebook = Path(notebook).absolute()
    directory = store_dir if store_dir is not None else locate.store_dir(notebook)
    run_id = locate.run_id_for(notebook, directory)
    runs: list[dict[str, Any]] = []
    if opener.exists(directory):
        with open_store(directory) as store:
            runs = [
                {"run": r.run, "parent": r.parent, "steps": r.steps, "last": r.last}
                for r in admin.list_runs(store)
            ]
    return {"run": run_id, "runs": runs}


def compare_with(notebook: Path, other: str, store_dir: Path | None = None) -> dict[str, Any]:
    """The notebook's run beside run ``other``: ``nbdurable diff``'s ``--json`` answer.

    Raises :class:`UsageProblem` for a run the store does not hold.
    """
    from .. import rundiff

    notebook = Path(notebook).absolute()
    directory = store_dir if store_dir is not None else locate.store_dir(notebook)
    run_id = locate.run_id_for(notebook, directory)
    if not opener.exists(directory):
        raise UsageProblem(f"no store at {directory} yet: nothing to compare")
    with open_store(directory) as store:
        rundiff.check_runs(store, run_id, other)
        rows = rundiff.diff_runs(store, run_id, other, notebook)
    return rundiff.to_json(run_id, other, rows)


def act(
    notebook: Path,
    action: str,
    key: str | None = None,
    store_dir: Path | None = None,
    reason: str = "",
) -> dict[str, Any]:
    """Pin, unpin or clear one step of ``notebook``'s run, clear the whole run, or
    approve or reject one of its pending approvals.

    The sidebar's buttons and the cell menu's commands: the same operations as
    ``nbdurable pin`` / ``clear`` (:mod:`nbdurable.commands`) and ``nbdurable
    approve`` / ``reject`` (:func:`nbdurable.commands.decide`; ``key`` is then
    the approval's id, or ``STEP/ID``, and ``reason`` what a rejection says), on
    the store :func:`step_marks` reads, so the answer is ``{"message": <the line
    the CLI prints>}`` with the marks as they are after it. A kernel recording
    into the run keeps its lease (a clear never takes it); a kernel waiting for
    the approval sees the decision within a second and goes on. Raises
    :class:`~nbdurable.errors.UsageProblem` for an unknown action or step, and
    when nothing is recorded yet; its subclasses
    :class:`~nbdurable.errors.UnknownApproval` and
    :class:`~nbdurable.errors.NotPending` for an approval not known or already
    decided.
    """
    if action not in ACTIONS:
        raise UsageProblem(f"unknown action {action!r}; one of: {', '.join(ACTIONS)}")
    deciding = action in ("approve", "reject")
    if action != "clear-all" and not key:
        raise UsageProblem(f"{action}: which {'approval' if deciding else 'step'}? (give its key)")
    if not isinstance(reason, str):
        raise UsageProblem(f"{action}: the reason must be text, got {type(reason).__name__}")
    notebook = Path(notebook).absolute()
    directory = store_dir if store_dir is not None else locate.store_dir(notebook)
    if not opener.exists(directory):
        raise UsageProblem(f"nothing is recorded for {notebook.name} yet; run it first")
    run_id = locate.run_id_for(notebook, directory)
    with open_store(directory) as store:
        if deciding:
            done = commands.decide(store, run_id, str(key), action == "approve", reason)
        elif action == "clear-all":
            done = commands.clear_run(store, run_id)
        elif action == "clear":
            done = commands.clear_steps(store, run_id, [str(key)], notebook)
        else:
            done = commands.pin_steps(store, run_id, [str(key)], notebook, pinned=action == "pin")
    return {"message": done.message, **step_marks(notebook, store_dir)}
