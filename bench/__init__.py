"""nbdurable's benchmarks against the alternatives, side by side in one process.

Run ``python -m bench`` from the repository root (``--help`` for options);
``bench/README.md`` says what each section measures and how to profile.
"""
