"""The IPython side: everything that touches the shell.

The ``%%step`` / ``%step`` magic and its argument parser (:mod:`.magic`,
:mod:`.args`), a ``%%step`` cell run by IPython itself (:mod:`.cellstep`)
or from code (:mod:`.execute`), output capture and replay
(:mod:`.capture`, :mod:`.kernelio`, :mod:`.widgettext`), the step panel
(:mod:`.panel`, :mod:`.rows`), and the durable engine's host over a shell
(:mod:`.host`). Importing this package installs that host as the default
(see :mod:`nbdurable.durable.host`).
"""

from . import host  # noqa: F401 - sets the engine's default host and capture hooks
