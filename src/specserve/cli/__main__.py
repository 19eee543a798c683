"""`python -m specserve.cli`: the same as the `specserve` command."""

import sys

from .main import main

sys.exit(main())
