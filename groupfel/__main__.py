"""``python -m groupfel``: the ``groupfel`` command."""
import sys

from groupfel.experiments.cli import main

sys.exit(main())
