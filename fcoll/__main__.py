"""``python -m fcoll``: the command line (`fcoll.cli`)."""

from __future__ import annotations

import sys

from fcoll.cli import main

if __name__ == "__main__":
    sys.exit(main())
