"""Model and HTTP clients, as nbdurable records and replays them.

Pure helpers (no IPython, no store) that the kernel side wires into sub-steps:
token usage read from SDK replies (:mod:`.usage`), streams recorded as they are
consumed and replayed through the SDK's own parser (:mod:`.streams`), awaitables
told by what a call returns (:mod:`.awaitables`), and HTTP exchanges recorded at
the transport level (:mod:`.http_record`).
"""
