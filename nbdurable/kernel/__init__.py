"""The kernel side: everything that runs inside IPython.

The run context and its lease (:mod:`.session`, :mod:`.lease`), the step
runner (:mod:`.stepper`, recording through :mod:`.recording`), cell
execution (:mod:`.execute`), what a running step knows (:mod:`.context`),
sub-steps (:mod:`.substeps`), the ``%%step`` magic (:mod:`.magic`), output
capture (:mod:`.capture`) and the panel (:mod:`.panel`, :mod:`.rows`).
"""
