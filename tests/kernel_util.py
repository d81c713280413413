"""Run notebooks in real kernels for tests, and compare their outputs.

Shared by every real-kernel test (mark them ``@pytest.mark.kernel``)::

    nb = make_notebook(["import nbdurable", "%%step\\nprint('hi')"])
    nb = run_notebook(nb, cwd=tmp_path, env={"NBDURABLE_DIR": str(tmp_path)})
    assert stream_text(outputs_of(nb, 1)) == "hi\\n"

The kernel imports ``nbdurable`` from this checkout (its root is put first on
the kernel's ``PYTHONPATH``), so the package need not be installed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbformat import NotebookNode
from traitlets.config import Config

REPO_ROOT = Path(__file__).resolve().parent.parent

#: Kernel spec used by run_notebook; see kernel_name().
KERNEL_NAME = "python3"

_MAJOR, _MINOR = sys.version_info[:2]
_PYTHON_NAMES = {"python", f"python{_MAJOR}", f"python{_MAJOR}.{_MINOR}"}


def kernel_name() -> str:
    """Name of a kernel spec that runs *this* interpreter, installing one if needed.

    jupyter_client rewrites a spec whose argv starts with a bare ``python`` to
    ``sys.executable``, and provides ``python3`` for the running interpreter
    when no spec of that name is installed. Only a ``python3`` spec pointing at
    some other interpreter needs a user spec installed (idempotently).
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    except NoSuchKernel:
        spec = None
    if spec is not None:
        exe = spec.argv[0] if spec.argv else ""
        if exe in _PYTHON_NAMES or _same_file(exe, sys.executable):
            return KERNEL_NAME
    from ipykernel.kernelspec import install

    install(user=True, kernel_name=KERNEL_NAME)
    return KERNEL_NAME


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


@contextlib.contextmanager
def private_sockets() -> Iterator[dict[str, str]]:
    """KernelManager settings that put a kernel's sockets in a fresh private directory.

    Over TCP, jupyter_client picks free ports and the kernel binds them a moment
    later; with several kernels starting at once (the suite, or anything else on
    the machine), another process can take a port in between and the kernel dies
    with "Address already in use". IPC sockets are files in a directory no one
    else uses, so nothing can race for them. The directory is short-lived and
    short-named: a Unix socket path must stay under about 100 bytes.
    """
    directory = tempfile.mkdtemp(prefix="nbk-")
    try:
        yield {"transport": "ipc", "ip": os.path.join(directory, "k")}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def make_notebook(cells: Iterable[str], nbformat_minor: int = 5) -> NotebookNode:
    """A v4 notebook whose code cells hold `cells`, in order."""
    nb = nbformat.v4.new_notebook()
    nb.nbformat_minor = nbformat_minor
    nb.metadata["kernelspec"] = {
        "name": KERNEL_NAME,
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    if nbformat_minor < 5:
        for cell in nb.cells:
            cell.pop("id", None)
    return nb


def run_notebook(
    nb: NotebookNode,
    *,
    cwd: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    timeout: int = 120,
    allow_errors: bool = False,
    startup_timeout: int = 60,
) -> NotebookNode:
    """Execute `nb` in a fresh real kernel and return it with its outputs.

    The kernel runs in `cwd`, with this process's environment plus `env`
    (nbclient's ``execute(**kwargs)`` go to ``KernelManager.start_kernel``,
    whose ``env`` *replaces* the environment, hence the merge). The kernel is
    shut down afterwards. `nb` is modified in place and returned.
    `startup_timeout` bounds the wait for a new kernel to answer: raise it
    where many kernels start in a row on a loaded machine.
    """
    kernel_env = dict(os.environ)
    kernel_env.update(env or {})
    kernel_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), kernel_env.get("PYTHONPATH", "")) if p
    )
    with private_sockets() as sockets:
        client = NotebookClient(
            nb,
            timeout=timeout,
            kernel_name=kernel_name(),
            allow_errors=allow_errors,
            startup_timeout=startup_timeout,
            resources={"metadata": {"path": str(cwd)}},
            config=Config({"KernelManager": sockets}),
        )
        return client.execute(env=kernel_env)


def normalize_outputs(
    outputs: Iterable[Mapping[str, Any]], *, execution_count: bool = True
) -> list[dict[str, Any]]:
    """Plain-dict copies of `outputs`, as a frontend would show them.

    Consecutive chunks of one stream are merged (ipykernel may split a stream
    across messages at any point), ``transient`` is dropped (it is never saved
    in a notebook), and so is ``execution_count`` unless `execution_count`.
    """
    result: list[dict[str, Any]] = []
    for output in outputs:
        out = _plain(output)
        out.pop("transient", None)
        if not execution_count:
            out.pop("execution_count", None)
        last = result[-1] if result else None
        if (
            out.get("output_type") == "stream"
            and last is not None
            and last.get("output_type") == "stream"
            and last.get("name") == out.get("name")
        ):
            last["text"] += out["text"]
        else:
            result.append(out)
    return result


def outputs_of(nb: NotebookNode, index: int, *, execution_count: bool = True) -> list[dict]:
    """Normalized outputs of code cell `index` of `nb` (see normalize_outputs)."""
    return normalize_outputs(nb.cells[index].get("outputs", []), execution_count=execution_count)


def stream_text(outputs: Iterable[Mapping[str, Any]], name: str = "stdout") -> str:
    """All text of stream `name` in `outputs`, concatenated."""
    return "".join(
        o["text"] for o in outputs if o.get("output_type") == "stream" and o.get("name") == name
    )


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


#: A notebook cell defining ``ran(name)``, which appends ``name`` to ``ran.log`` in
#: the kernel's working directory: how the kernel tests count real executions.
RAN_CELL = "def ran(name):\n    with open('ran.log', 'a') as f:\n        f.write(name + '\\n')"


def ran(tmp: Path, log: str = "ran.log") -> Counter:
    """How many times each name was logged by ``ran(name)`` in ``tmp``, over every run so far."""
    path = tmp / log
    return Counter(path.read_text().split()) if path.exists() else Counter()


def durable_env(tmp: Path, **extra: str) -> dict[str, str]:
    """A kernel's environment for a notebook saved at ``tmp/nb.ipynb`` recording to ``tmp/store``.

    ``JPY_SESSION_NAME`` is emptied: a test run under a Jupyter server must not
    take the server's notebook for this one.
    """
    return {
        "NBDURABLE_DIR": str(tmp / "store"),
        "NBDURABLE_NOTEBOOK": str(tmp / "nb.ipynb"),
        "JPY_SESSION_NAME": "",
        **extra,
    }


def run_saved(
    tmp: Path,
    cells: Iterable[str] | NotebookNode,
    *,
    env: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> NotebookNode:
    """Save the notebook at ``tmp/nb.ipynb``, as a user would have it, and run it there.

    ``cells`` are code cells' sources (or a notebook, run as it is); ``env``
    defaults to :func:`durable_env`. Other keywords go to :func:`run_notebook`.
    """
    nb = cells if isinstance(cells, NotebookNode) else make_notebook(cells)
    nbformat.write(nb, tmp / "nb.ipynb")
    return run_notebook(nb, cwd=tmp, env=durable_env(tmp) if env is None else env, **kwargs)
