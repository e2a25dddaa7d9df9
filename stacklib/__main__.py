"""``python -m stacklib``: the command line (as ``stacklib``), so that ``stacklib spawn`` can
start ``stacklib run RECIPE`` as its ranks' program."""

import sys

from stacklib.cli import main

sys.exit(main())
