"""The experiment helpers a notebook calls: :func:`compare` two runs of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import rundiff as comparing
from ..store import opener
from .session import get_session


def compare(
    run_a: str,
    run_b: str,
    notebook: str | Path | None = None,
    store: str | Path | None = None,
) -> Any:
    """Two runs side by side, one row per step: a pandas DataFrame, else a list of dicts.

    ``nbdurable.compare("cats", "dogs")`` compares two runs of this notebook
    (its named runs, ``%step run NAME``, or its own run by its id, as
    ``nbdurable ls`` lists them) in the store this kernel records to;
    ``notebook`` and ``store`` name others. Columns: ``step``, ``cell``,
    ``verdict`` (same, differs, only in A, only in B), ``what`` (the
    differences, see :mod:`nbdurable.rundiff`), and per run ``seconds``,
    ``calls``, ``tokens``. An unknown run is a one-line ``UsageProblem``.
    """
    session = get_session()
    path = Path(notebook).expanduser().absolute() if notebook is not None else session.notebook
    target = opener.open_store(store) if store is not None else session.store
    try:
        comparing.check_runs(target, run_a, run_b)
        rows = comparing.table(run_a, run_b, comparing.diff_runs(target, run_a, run_b, path))
    finally:
        if store is not None:
            target.close()
    try:
        import pandas as pd
    except ImportError:
        return rows
    return pd.DataFrame(rows)
