"""The runner: ``nbdurable run`` drives real kernels from outside through nbclient.

Never imports :mod:`nbdurable.kernel`: it learns what a kernel did from the
store, the cells' outputs, and the kernel's public run summary.
"""
