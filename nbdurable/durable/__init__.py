"""The durable engine: plan, replay or execute, record; no IPython here.

The run in this process and its lease (:mod:`.session`, :mod:`.lease`),
which cell is which (:mod:`.cellkeys`), the step runner (:mod:`.stepper`,
with :mod:`.plan`, :mod:`.mutation`, :mod:`.changes` and recording through
:mod:`.recording`), what a running step knows (:mod:`.context`) and reads
(:mod:`.envreads`, :mod:`.fileio`), sub-steps (:mod:`.substeps`) and HTTP
steps (:mod:`.httpsteps`). What it needs from the shell comes through a
:class:`~.host.Host` (:mod:`.host`); :mod:`nbdurable.ipython` implements it.
"""
