"""`python -m deltaserve`: the same command line as `deltaserve`."""

import sys

from deltaserve.cli import main

sys.exit(main())
