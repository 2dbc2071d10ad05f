"""`python -m proctor.cli`: the `proctor` command, for where the script is not on PATH."""

from __future__ import annotations

import sys

from proctor.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
