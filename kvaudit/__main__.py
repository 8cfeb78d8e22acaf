"""`python -m kvaudit ...`, the same as the `kvaudit` command."""

import sys

from kvaudit.cli import main

sys.exit(main())
