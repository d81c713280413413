"""``python -m nbdurable``: the same as the ``nbdurable`` command."""

from .cli import main

raise SystemExit(main())
