"""Every exception and warning class nbdurable raises.

Each one subclasses a builtin, so a user's ``except ValueError`` or
``except RuntimeError`` keeps working, and all of them share
:class:`NbdurableError` for ``except NbdurableError``.
"""

from __future__ import annotations


class NbdurableError(Exception):
    """Base class of every nbdurable error."""


class UsageProblem(NbdurableError, ValueError):
    """Bad input from the user: an unknown step, a bad name, a bad option.

    The magic layer turns it into an IPython ``UsageError`` (one line, no
    traceback), in a step and in a plain cell alike (after ``%load_ext``); the
    CLI prints it and exits with code 2.
    """


class UnknownApproval(UsageProblem, LookupError):
    """No approval of the run waits under that name, and none was decided under it.

    The CLI exits with code 2, as for any UsageProblem; the server answers 404.
    """


class NotPending(UsageProblem):
    """The approval named was already decided: a second decision is refused.

    The first decision stands (it may have been made on another machine);
    the message says who made it. The CLI exits with code 2; the server answers 409.
    """


class BadArgument(UsageProblem, TypeError):
    """An argument of the wrong type to nbdurable's API (``step(123, fn)``): a
    ``TypeError`` for ``except TypeError``, said in one line as a UsageProblem is.
    """


class SettingError(UsageProblem):
    """A bad argument to :func:`nbdurable.configure`.

    After ``%load_ext nbdurable`` a notebook shows it in one line, as the
    magics show a UsageProblem: a setting is input, not a bug to trace.
    """


class StoreError(NbdurableError, OSError):
    """The store cannot be opened, read or written; the message says what to do."""


class DamagedDatabase(StoreError):
    """A store's database file cannot be read as one, or lost its records (emptied):
    ``nbdurable check`` keeps a copy of it and starts it afresh. ``db_file``: its path.
    """

    def __init__(self, message: str, db_file: str = "") -> None:
        super().__init__(message)
        self.db_file = db_file


class FormatVersionError(StoreError):
    """The store was written by a newer (or unknown) on-disk format."""


class CorruptRecord(NbdurableError, ValueError):
    """A record failed its signature check or could not be decoded.

    nbdurable treats such a record as *not recorded* (the step runs again)
    and warns, naming the step; it never loads an unverified pickle.
    """


class StaleRecord(CorruptRecord):
    """A record that verifies but is not current: its run's manifest says it was cleared
    or replaced since (see :mod:`nbdurable.store.manifest`). Its step runs again.

    ``reason`` says which (one of ``nbdurable.store.manifest.REFUSALS``):
    ``"unproven"`` (its run's manifest is missing or unreadable), ``"cleared"``
    or ``"replaced"``.
    """

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class LiveCallRefused(UsageProblem):
    """Verify mode (``configure(mode="verify")``, ``nbdurable verify``) met live work.

    A step with no usable record, or a sub-step or HTTP request the record
    does not hold, would have run for real: it stops the cell instead, in
    one line naming it (a ``UsageProblem``, so magics show it as one line).
    """


class DivergenceError(NbdurableError, RuntimeError):
    """A sub-step id was called with arguments that differ from its record.

    Raised only with ``nbdurable.configure(on_divergence="error")``.
    """


class LeaseHeld(NbdurableError, RuntimeError):
    """Another live process holds the lease on this run."""


class LeaseLost(LeaseHeld):
    """The lease of this process on the run was taken over: a record it wrote was refused.

    Raised by a write under a lease (see ``nbdurable.store.base.Fence``) once
    another process holds the run: nothing of the write was recorded.
    """


class ApprovalPending(NbdurableError, RuntimeError):
    """A run without a person at it (``nbdurable run``) reached an approval not yet decided.

    The approval is recorded as pending; the run stops here (``nbdurable run``
    exits with code 7) and the message names the approval and the command that
    decides it. The next run replays everything before it and continues with
    the decision. Shown as that one line, without a traceback.
    """

    def _render_traceback_(self) -> list[str]:  # IPython: the message, no traceback
        return [f"{type(self).__name__}: {self}"]


class Rejected(NbdurableError, RuntimeError):
    """A person rejected the approval (``approve(..., raises=True)``, ``@recorded(approve=True)``).

    ``approval`` is its id, ``by`` who rejected it, ``reason`` what they said ("" if nothing).
    """

    def __init__(self, message: str, approval: str = "", by: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.approval, self.by, self.reason = approval, by, reason


class RepeatRefused(UsageProblem):
    """A step's body would run again on replay and write to a database file a second time.

    The message names the file and says how to run it anyway (``%%step --force``).
    """


class NotRestored(NbdurableError, RuntimeError):
    """A handle (an engine, a session, a connection) a replayed step bound was used.

    It was not saved; what the step did through it is in the database file.
    """

    def _render_traceback_(self) -> list[str]:  # IPython: the message, no traceback
        return [f"{type(self).__name__}: {self}"]


class NbdurableWarning(UserWarning):
    """Something was not recorded, or a record could not be used (always shown, never silent)."""
