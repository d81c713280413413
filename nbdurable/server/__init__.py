"""The jupyter_server extension: where a run stands, for the cell marks, with no kernel.

Two endpoints, under ``<base url>/nbdurable/api/steps``:

- ``GET ...?path=<notebook path>``: ``path`` is the notebook's path as the
  frontend knows it (relative to the server's root directory); the answer is
  :func:`nbdurable.server.marks.step_marks` as JSON (the cell marks and the
  sidebar draw it). With ``&runs=1``: the store's runs and their parents
  (:func:`~nbdurable.server.marks.runs_of`); with ``&compare=RUN``: the
  notebook's run beside ``RUN``, step by step
  (:func:`~nbdurable.server.marks.compare_with`), for the side panel's Runs.
- ``POST`` with the JSON body ``{"path": ..., "action": "pin" | "unpin" |
  "clear" | "clear-all", "key": <step key>}``, or ``{"path": ..., "action":
  "approve" | "reject", "key": <approval id>, "reason": <text, optional>}``:
  the sidebar's buttons and the cell menu's commands
  (:func:`nbdurable.server.marks.act`), answered with ``message`` (the line
  ``nbdurable pin`` / ``clear`` / ``approve`` prints) and the marks as they
  are after it. It changes the store, so it takes the server's XSRF check
  like every other POST of jupyter_server.

A path outside the root, or not a notebook file, gets a 4xx with a one-line
``message``, as does an unknown action or step (400), an approval that is not
known (404) or was already decided (409: the first decision stands); a store
that cannot be read gets a 500 saying why.

The extension is enabled on install: the package installs
``etc/jupyter/jupyter_server_config.d/nbdurable.json`` (see ``pyproject.toml``),
which lists this module in ``ServerApp.jpserver_extensions``. The frontend
half (``js/``, prebuilt into ``nbdurable/labextension/``) is installed into
``share/jupyter/labextensions/nbdurable/``, so no Node is needed.

Reading the store is blocking file and SQLite work; it runs on a worker
thread, never on the server's event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

#: The endpoint, under the server's base URL.
ROUTE = "nbdurable/api/steps"


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "nbdurable.server"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from jupyter_server.utils import url_path_join

    web_app = serverapp.web_app
    route = url_path_join(web_app.settings["base_url"], ROUTE)
    web_app.add_handlers(".*$", [(route, _handler_class())])
    serverapp.log.info("nbdurable: cell marks served at %s", route)


def notebook_path(root: str | os.PathLike[str], api_path: str) -> Path:
    """The file of ``api_path`` under ``root``; ValueError if it is not inside it."""
    root_path = Path(root).resolve()
    parts = api_path.strip("/").split("/")
    if not api_path.strip("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"path {api_path!r} is not a notebook path relative to the server root")
    path = Path(os.path.abspath(root), *parts)
    real = path.resolve()
    if root_path != real and root_path not in real.parents:
        raise ValueError(f"path {api_path!r} is outside the server root")
    # Unresolved, as jupyter_server tells the kernel (JPY_SESSION_NAME): the run
    # id is the notebook's path relative to the store, symlinks and all.
    return path


def _status(exc: Exception) -> int:
    """The HTTP status of one of nbdurable's errors: the most specific class listed wins."""
    from ..errors import NotPending, UnknownApproval, UsageProblem

    for cls, status in ((UnknownApproval, 404), (NotPending, 409), (UsageProblem, 400)):
        if isinstance(exc, cls):
            return status
    return 500


def _handler_class() -> type:
    # Imported here: importing nbdurable must not import tornado or jupyter_server.
    from jupyter_server.base.handlers import APIHandler
    from tornado import web

    from ..errors import NbdurableError
    from ..text import one_line
    from .marks import act, compare_with, runs_of, step_marks

    class StepsHandler(APIHandler):
        """``GET /nbdurable/api/steps?path=...``: the marks' data; ``POST``: an action."""

        @web.authenticated
        async def get(self) -> None:
            path = self._notebook(self.get_query_argument("path", ""))
            if path is None:
                return None
            other = self.get_query_argument("compare", None)
            try:
                if other is not None:
                    data = await asyncio.to_thread(compare_with, path, other)
                elif self.get_query_argument("runs", None):
                    data = await asyncio.to_thread(runs_of, path)
                else:
                    data = await asyncio.to_thread(step_marks, path)
            except NbdurableError as exc:
                return self._fail(_status(exc), one_line(str(exc)))
            self._answer(data)

        @web.authenticated
        async def post(self) -> None:
            try:
                body = json.loads(self.request.body or b"{}")
                api_path, action = str(body.get("path", "")), str(body.get("action", ""))
                key, reason = body.get("key"), body.get("reason") or ""
            except (ValueError, AttributeError):
                return self._fail(400, 'the body must be JSON: {"path", "action", "key"}')
            path = self._notebook(api_path)
            if path is None:
                return None
            try:
                data = await asyncio.to_thread(act, path, action, key, None, reason)
            except NbdurableError as exc:
                return self._fail(_status(exc), one_line(str(exc)))
            self._answer(data)

        def _notebook(self, api_path: str) -> Path | None:
            """The notebook file of ``api_path``; None once a 4xx has been sent."""
            root = self.settings.get("server_root_dir") or os.getcwd()
            try:
                path = notebook_path(root, api_path)
            except ValueError as exc:
                self._fail(400, str(exc))
                return None
            if path.suffix != ".ipynb" or not path.is_file():
                self._fail(404, f"no notebook at {api_path!r}")
                return None
            return path

        def _answer(self, data: dict[str, Any]) -> None:
            self.set_header("Content-Type", "application/json")
            self.set_header("Cache-Control", "no-store")
            self.finish(json.dumps(data, default=str))

        def _fail(self, status: int, message: str) -> None:
            self.set_status(status)
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"message": message}))

    return StepsHandler
