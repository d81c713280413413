"""User settings, changed with :func:`nbdurable.configure`."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from .clients.usage import check_prices
from .errors import NbdurableWarning, SettingError, StoreError
from .store.versions import KEEP_VERSIONS

_DIVERGENCE = ("warn", "error", "rerun", "replay")
_DURABILITY = ("crash", "power")
_MODES = ("record", "verify")


@dataclass(frozen=True)
class Settings:
    """What :func:`configure` can change.

    - ``on_divergence``: when a sub-step id is called with arguments other
      than its record's: ``"warn"`` (default: warn, naming the step, and call
      again), ``"rerun"`` (call again silently), ``"replay"`` (return the
      recorded value anyway), ``"error"`` (raise ``DivergenceError``).
    - ``replay_note``: show the one-line "replayed" note under replayed steps.
    - ``warn_size_mb``: warn when one recorded value is larger than this
      (default 100 MB); it is still recorded, and stored once by content.
    - ``durability``: ``"crash"`` (default; a record survives a kernel crash)
      or ``"power"`` (also survives power loss; slower writes). Takes effect
      when the store is next opened.
    - ``store``: where runs are recorded: a directory, or a
      ``postgresql://`` URL for a team store (see ``nbdurable.store.opener``);
      None (default): ``NBDURABLE_STORE``, else ``NBDURABLE_DIR``, else
      ``.nbdurable/`` beside the notebook. Takes effect when the store is next opened.
    - ``http``: record the HTTP every step's body makes through httpx or
      requests (what ``%%step NAME --http`` asks for one step), replayed from
      the record when the body runs again, so a direct SDK call is never sent
      twice (default True; False: only steps marked ``--http``).
    - ``prices``: what tokens cost, ``{"model": (input per 1k, output per 1k)}``
      (a reply's dated model name takes the price of the longest name it starts
      with); with it, the tokens replay saved are also shown as money. None
      (default): tokens only. nbdurable never fetches prices.
    - ``mode``: ``"record"`` (default: run what has no usable record, and
      record it) or ``"verify"`` (replay only: a step that would run for lack
      of a record, or a sub-step or HTTP request not in the record, stops the
      cell with :class:`~nbdurable.errors.LiveCallRefused` instead of running;
      see ``nbdurable verify``). ``NBDURABLE_MODE`` sets it for a kernel.
    - ``live``: sub-step id patterns (``fnmatch`` globs, e.g. ``("llm:*",)``)
      whose calls run live although recorded, while every other sub-step
      replays: a step holding such a sub-step runs its body again (saying
      so), its other sub-steps replaying. ``NBDURABLE_LIVE`` (comma-separated)
      sets it for a kernel, as ``nbdurable run --live`` does. Default ``()``.
    - ``keep_versions``: how many versions (code and inputs) of each step keep
      their records, the current one included (default 10,
      ``store.versions.KEEP_VERSIONS``); a step set back
      to a kept version replays it. See ``nbdurable.store.versions``.
    """

    on_divergence: str = "warn"
    replay_note: bool = True
    durability: str = "crash"
    warn_size_mb: float = 100.0
    store: str | None = None
    prices: dict[str, tuple[float, float]] | None = None
    http: bool = True
    keep_versions: int = KEEP_VERSIONS
    mode: str = "record"
    live: tuple[str, ...] = ()

    def __repr__(self) -> str:
        # A store URL's password never shows: this repr is printed, and a step that
        # shows its settings records what it printed.
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        if isinstance(self.store, str):
            shown["store"] = masked_url(self.store)
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


def masked_url(url: str) -> str:
    """``url`` with its password (in the user part or a ``password=`` parameter) as ``***``."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            userinfo, _, hostport = netloc.rpartition("@")
            netloc = f"{userinfo.split(':', 1)[0]}:***@{hostport}"
        query = parts.query
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k.lower() in ("password", "passwd") for k, _ in pairs):
            query = urlencode(
                [(k, "***" if k.lower() in ("password", "passwd") else v) for k, v in pairs],
                safe="*",
            )
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:  # not a URL after all (a path with odd characters)
        return url


def _mode_from_env() -> str:
    """``NBDURABLE_MODE`` (set by ``nbdurable verify``).

    A value that is neither mode verifies: whoever set the variable may have
    meant "verify", and the safe side of a typo is a run that makes no live
    call (said in one line).
    """
    mode = os.environ.get("NBDURABLE_MODE") or "record"
    if mode in _MODES:
        return mode
    import warnings

    warnings.warn(
        f"NBDURABLE_MODE={mode!r} is neither 'record' nor 'verify': verifying (no live "
        "call is made); fix the variable or call configure(mode=...)",
        NbdurableWarning,
        stacklevel=2,
    )
    return "verify"


def _live_from_env() -> tuple[str, ...]:
    """``NBDURABLE_LIVE``: comma-separated sub-step id patterns (set by ``--live``)."""
    return tuple(p.strip() for p in os.environ.get("NBDURABLE_LIVE", "").split(",") if p.strip())


def is_live(sub_id: str) -> bool:
    """Whether sub-step ``sub_id`` runs live although recorded (the ``live`` setting)."""
    patterns = _settings.live
    if not patterns:
        return False
    from fnmatch import fnmatchcase

    return any(fnmatchcase(sub_id, p) for p in patterns)


_settings = Settings(mode=_mode_from_env(), live=_live_from_env())


def get() -> Settings:
    """The current settings."""
    return _settings


def configure(**changes: object) -> Settings:
    """Change settings, e.g. ``configure(on_divergence="error")``; returns the new settings."""
    global _settings
    known = {f.name for f in fields(Settings)}
    for key in changes:
        if key not in known:
            raise SettingError(
                f"unknown setting {key!r}; known settings: {', '.join(sorted(known))}"
            )
    if "on_divergence" in changes and changes["on_divergence"] not in _DIVERGENCE:
        raise SettingError(
            f"on_divergence must be one of {', '.join(_DIVERGENCE)} "
            f"(got {changes['on_divergence']!r})"
        )
    if "durability" in changes and changes["durability"] not in _DURABILITY:
        raise SettingError(
            f"durability must be one of {', '.join(_DURABILITY)} (got {changes['durability']!r})"
        )
    if "mode" in changes and changes["mode"] not in _MODES:
        raise SettingError(f"mode must be one of {', '.join(_MODES)} (got {changes['mode']!r})")
    if "http" in changes and not isinstance(changes["http"], bool):
        raise SettingError(f"http must be True or False (got {changes['http']!r})")
    if "replay_note" in changes and not isinstance(changes["replay_note"], bool):
        raise SettingError(f"replay_note must be True or False (got {changes['replay_note']!r})")
    store = changes.get("store")
    if store is not None:
        _check_store(store)
    size = changes.get("warn_size_mb", 1)
    if isinstance(size, bool) or not isinstance(size, (int, float)) or size <= 0:
        raise SettingError(f"warn_size_mb must be a positive number (got {size!r})")
    if "live" in changes:
        live = changes["live"]
        if isinstance(live, str):
            live = (live,)
        if not isinstance(live, (list, tuple)) or not all(
            isinstance(p, str) and p.strip() for p in live
        ):
            raise SettingError(
                f"live must be a list of sub-step id patterns such as ['llm:*'] (got {live!r})"
            )
        changes["live"] = tuple(p.strip() for p in live)
    if changes.get("prices") is not None:
        changes["prices"] = _prices(changes["prices"])
    keep = changes.get("keep_versions", 1)
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise SettingError(f"keep_versions must be a whole number of at least 1 (got {keep!r})")
    _settings = replace(_settings, **changes)  # type: ignore[arg-type]
    return _settings


def _check_store(store: object) -> None:
    """A store setting must name a directory, or a URL whose store opens now.

    A URL is opened (and closed) here, so a bad URL, a missing key or a server
    that is down is said at the ``configure`` line and the setting stays as it
    was; a kernel already recording moves to the new store between steps
    (see ``durable.session``).
    """
    if not isinstance(store, str) or not store.strip():
        raise SettingError(f"store must be a directory or a postgresql:// URL (got {store!r})")
    from .store import opener

    try:
        opener.engine_for(store)
        if opener.is_url(store):
            opener.open_store(store).close()
    except StoreError as exc:
        raise SettingError(f"store not changed: {exc}") from None


def _prices(prices: Any) -> dict[str, tuple[float, float]]:
    try:
        return check_prices(prices)
    except ValueError as exc:
        raise SettingError(str(exc)) from None


def chosen_store(default_dir: Path) -> str | Path:
    """The store to open, first match wins.

    1. ``nbdurable.configure(store=...)`` (a directory or a URL);
    2. ``NBDURABLE_STORE`` in the environment (a directory or a URL);
    3. ``default_dir``: the directory of :func:`nbdurable.identity.locate.store_dir`
       (``NBDURABLE_DIR``, else ``.nbdurable/`` beside the notebook).
    """
    from .store import opener

    raw = get().store or os.environ.get("NBDURABLE_STORE", "").strip()
    if not raw:
        return default_dir
    return raw if opener.is_url(raw) else Path(raw).expanduser().absolute()
