"""Which cell is executing: its step key, label and position in the notebook.

A ``%%step NAME`` cell is keyed by its name; an unnamed one by the cell id
the frontend sent (JupyterLab, Notebook 7, VS Code), else by the id and
position of the saved cell whose source it is (nbclient, nbconvert and
papermill send neither), else by its source and how many times that source
ran before in this kernel (no notebook file). See
:mod:`nbdurable.identity.keys` for the keys themselves and
:mod:`nbdurable.identity.locate` for the notebook file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageProblem
from ..identity import keys, locate

if TYPE_CHECKING:
    from .session import Session


class CellKeys:
    """The step keys of one session's cells, and what telling identical cells apart needs."""

    def __init__(self, session: Session) -> None:
        self.session = session
        #: identical unnamed cells told apart by occurrence (see resolve): how many
        #: times each body ran without a cell id or position, and where each frontend
        #: cell id that is not saved in the file was placed
        self._occurrences: dict[str, int] = {}
        self._placed: dict[str, int] = {}

    def resolve(self, name: str | None, body: str) -> tuple[str, str, int | None]:
        """``(key, label, position)`` of the executing cell (see :mod:`nbdurable.identity.keys`)."""
        session = self.session
        cell_id, position = session.host.frontend_cell()
        transient = None  # a frontend id the file does not keep (nbformat 4.4)
        session._locate()
        if session.nbfile is not None and session.nbfile.refresh():
            if name is not None:
                _refuse_shared_name(name, session.nbfile, session.notebook)
            if cell_id is not None and not session.nbfile.ids_persist:
                # nbformat 4.4 on disk: the frontend invents a new id on every load.
                transient, cell_id = cell_id, None
            saved = self._find_saved(session.nbfile, body, cell_id, position, transient)
            if saved is not None:
                position = saved.index
                # nbclient and nbconvert send no cell id; the saved one is the id
                # JupyterLab would send, and the one `%step list` reads.
                cell_id = cell_id or saved.cell_id
        if name is not None:
            return (*keys.step_key(name, None, None, body), position)
        key, label = keys.step_key(None, cell_id, position, body)
        if cell_id is None and position is None:  # no file: identical cells by occurrence
            n = self._occurrence(key)
            if n:
                key, label = f"{key}:{n + 1}", f"{label} ({n + 1})"
        return key, label, position

    def _find_saved(
        self,
        nbfile: locate.NotebookFile,
        body: str,
        cell_id: str | None,
        position: int | None,
        transient: str | None,
    ) -> locate.StepCell | None:
        """The saved cell running now; identical unnamed cells told apart by occurrence.

        A client that sends no cell id and no position (nbclient, nbconvert,
        papermill, a frontend on an nbformat 4.4 file) runs identical cells
        in order: the k-th execution of a body is the k-th saved cell with it
        (cyclically, so a second pass of the notebook starts again at the
        first). A frontend id seen before keeps the cell it was given.
        """
        if cell_id is not None or position is not None:
            return nbfile.find(body, position)
        same = nbfile.find_all(body)
        if len(same) < 2:
            return same[0] if same else None
        if transient is not None and transient in self._placed:
            return next((c for c in same if c.index == self._placed[transient]), same[0])
        found = same[self._occurrence(keys.source_fingerprint(body)) % len(same)]
        if transient is not None:
            self._placed[transient] = found.index
        return found

    def _occurrence(self, what: str) -> int:
        """How many times ``what`` ran before in this kernel (and count this one)."""
        with self.session.lock:
            n = self._occurrences.get(what, 0)
            self._occurrences[what] = n + 1
            return n


def _refuse_shared_name(name: str, nbfile: locate.NotebookFile, notebook: Path | None) -> None:
    """A ``%%step NAME`` that two saved cells use is refused: they would share one record."""
    indexes = [c.index for c in nbfile.cells if c.name == name]
    if len(indexes) > 1:
        cells = ", ".join(f"#{i + 1}" for i in indexes)
        where = notebook.name if notebook is not None else "the notebook"
        raise UsageProblem(
            f"step name {name!r} is used by {len(indexes)} cells of {where} (cells {cells}); "
            "give each %%step its own name"
        )
