"""The notebook file of a run: read it, write it back atomically, read what a kernel left."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import IO, Any

from ..errors import UsageProblem


def check_path(raw: str | os.PathLike[str]) -> Path:
    """``raw`` as an absolute, normalized path to a notebook file, or :class:`UsageProblem`.

    The one check of a notebook argument, for every command: one wording for
    a missing file, a directory and a file that is not notebook JSON.
    """
    try:
        path = Path(os.path.abspath(Path(raw).expanduser()))
    except RuntimeError:  # `~user` of no such user
        raise UsageProblem(f"cannot expand {str(raw)!r}: no such user's home directory") from None
    try:
        is_dir, is_file = path.is_dir(), path.is_file()
    except OSError:  # e.g. a name too long for the file system: no such file
        is_dir = is_file = False
    if is_dir:
        inside = sorted(p.name for p in path.glob("*.ipynb"))[:3]
        hint = f" ({', '.join(inside)})" if inside else ""
        raise UsageProblem(f"{path} is a directory: give the .ipynb file to use{hint}")
    if not is_file:
        raise UsageProblem(f"no notebook at {path}: check the path (expected an .ipynb file)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageProblem(
            f"{path} is not a notebook ({type(exc).__name__}: {exc}); expected Jupyter JSON"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise UsageProblem(f"{path} is not a notebook (no list of cells); expected Jupyter JSON")
    return path


def read_notebook(path: Path) -> Any:
    """The notebook at ``path`` as an nbformat v4 node; bad input raises :class:`UsageProblem`."""
    path = check_path(path)
    import nbformat  # slow to import (jsonschema): only once the input is known to be good

    try:
        return nbformat.read(path, as_version=4)
    except Exception as exc:  # nbformat raises many types for a file that is not a notebook
        raise UsageProblem(
            f"{path} is not a notebook ({type(exc).__name__}: {exc}); expected Jupyter JSON"
        ) from None


def write_atomic(nb: Any, path: Path) -> None:
    """Write the notebook so a crash never leaves a half-written file."""
    import nbformat

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file 0600; keep the notebook's own mode, or the usual one.
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            nbformat.write(nb, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def replay_note(outputs: list[Any], key: str) -> str | None:
    """The text of the engine's replay note for ``key`` among ``outputs``, if any."""
    for out in outputs:
        md = (out.get("metadata") or {}).get("nbdurable") or {}
        if md.get("note") == "replayed" and md.get("step") == key:
            return str((out.get("data") or {}).get("text/plain", ""))
    return None


def kernel_log_tail(log: IO[bytes], lines: int = 6) -> str:
    """The end of the kernel's own stdout/stderr, without jupyter's transport notice."""
    log.seek(0)
    text = log.read().decode("utf-8", "replace")
    kept = [ln for ln in text.splitlines() if ln.strip() and "without encryption" not in ln]
    return "\n".join(kept[-lines:])
