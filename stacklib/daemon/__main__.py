"""``python -m stacklib.daemon``: run (or query) the OS service daemon."""

import sys

from stacklib.daemon.cli import main

sys.exit(main())
