"""Identity: which step is this, and did anything it depends on change?

Shared by the kernel side, the store and the runner: step keys and names
(:mod:`.keys`), source analysis (:mod:`.analysis`), content fingerprints
(:mod:`.fingerprint`) and which notebook and store a process belongs to
(:mod:`.locate`). Nothing here imports IPython or the store.
"""
