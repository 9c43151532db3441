"""``python -m kilnet``: the same as the ``kilnet`` command."""
import sys

from .cli import main

sys.exit(main())
