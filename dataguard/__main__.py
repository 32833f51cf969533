"""`python -m dataguard ...` is the same as the `dataguard` command."""

import sys

from dataguard.cli import main

if __name__ == "__main__":
    sys.exit(main())
