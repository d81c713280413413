"""Process state a step changes besides its variables: recorded as a delta, re-applied on replay.

A plain run of a cell that calls ``np.random.seed(0)``, ``os.chdir(..)`` or
``helpers.REGISTRY.append(..)`` leaves the process different for every later
cell. Replaying the cell's variables alone would not, so around each step:

1. :func:`snapshot` takes a cheap copy of well-known process state before
   the body runs and again after it;
2. :func:`delta` turns the two into plain data (JSON-safe: no user objects,
   nothing that needs unpickling), kept in the step's record;
3. :func:`apply` re-applies it when the step is replayed, so later plain
   cells see the process exactly as after a plain run.

What is tracked, and how each part of a delta is re-applied:

==================  ===================================  =====================================
part                seen as                              re-applied as
==================  ===================================  =====================================
``env``             variables set / unset                ``os.environ`` set / unset
``cwd``             the new working directory            ``os.chdir``
``path``            entries added in front / at the      the same insertions, or the whole
                    back of ``sys.path``, else the list  list when entries were reordered
``random``          ``random.getstate()`` if changed     ``random.setstate``
``numpy_random``    NumPy's global (legacy) generator    ``np.random.set_state``
``warnings``        filters added in front / at the      ``warnings``' own add-filter rule,
                    back, else the whole list            or the whole list
``printoptions``    changed ``np.get_printoptions()``    ``np.set_printoptions``
``pandas``          changed pandas options               ``pd.set_option``
``rcparams``        changed matplotlib ``rcParams``      ``matplotlib.rcParams[k] = v``
``mplbackend``      the backend pyplot loaded (on its    ``pyplot.switch_backend``, unless
                    first figure: the inline backend     pyplot has loaded one already
                    registers IPython's figure PNG)
``recursionlimit``  ``sys.getrecursionlimit()``          ``sys.setrecursionlimit``
``decimal``         the decimal context's settings,      set on ``decimal.getcontext()``
                    flags and traps that changed         (if ``decimal`` was imported)
``modules``         module-level data of user modules    set, or updated in place (a list
                    (files outside the stdlib and        stays the same list), or deleted
                    site-packages) and attributes the
                    step's source assigns on modules
``dbfiles``         the SQLite files the step wrote to   nothing: the file keeps the rows (the
                    (see :mod:`.sqlite`)                 step runner decides from it, see
                                                         :mod:`nbdurable.dbwrites`)
==================  ===================================  =====================================

A module (NumPy, pandas, matplotlib) is looked at only if already imported:
nothing here imports a heavy module to take a snapshot, and :func:`apply`
imports one only when the delta holds something for it. A module imported
by the step itself is compared with its defaults.

Anything that cannot be described as plain data (a ``float_format``
callable, a warnings category defined in the notebook, a function
monkeypatched onto a module, a module attribute holding an object) is
listed under ``unreplayable`` with the reason: such a step is not replayed,
its body runs again. So is a changed environment variable whose name looks
secret (see :mod:`nbdurable.redact`): it is never written.

A thread of the user's code that the step started and left running (its
target a notebook or local-module function) cannot be started again by a
replay: it is an ``unreplayable`` reason too. A library's own threads (pool
workers, a client's) are not counted. So is a write to an in-memory SQLite
database still open when the step ends (an agent framework's session or
memory): its rows are not Python state a record can hold (see
:mod:`.sqlite`; :func:`watch_sqlite` starts watching).

Not tracked: other modules' state not named above (a library's internal
cache, a logging configuration), attributes of classes and objects held by
user modules changed in place, and monkeypatches done other than by an
attribute assignment in the step's own source (``setattr(mod, ..)`` with a
literal name counts).
"""

from .core import Snapshot, apply, delta, describe_filter, prepare, replayable_reasons, snapshot
from .modules import assigned_attributes, is_user_module, updated_in_place
from .plain import MAX_VALUE_CHARS, NotPlain, decode, encode
from .sqlite import install as watch_sqlite

__all__ = [
    "MAX_VALUE_CHARS",
    "NotPlain",
    "Snapshot",
    "apply",
    "assigned_attributes",
    "decode",
    "delta",
    "describe_filter",
    "encode",
    "is_user_module",
    "prepare",
    "replayable_reasons",
    "snapshot",
    "watch_sqlite",
    "updated_in_place",
]
