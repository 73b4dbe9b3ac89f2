"""``python -m forge``: the same as the ``forge`` console script."""

import sys

from forge.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
