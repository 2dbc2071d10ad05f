"""Tools for the interrupt tests: `wire` announces it started (a marker file), then hangs."""

from __future__ import annotations

import os
import time
from pathlib import Path

from proctor import tool


@tool(side_effect="read")
def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: The key.
    """
    return f"value of {key}"


@tool(side_effect="external", cost=1)
def wire(to: str) -> str:
    """Send money; hangs once started, so the test can interrupt it.

    Args:
        to: Recipient account.
    """
    Path(os.environ["PROCTOR_TEST_MARKER"]).write_text("tool")
    time.sleep(600)
    return f"wired to {to}"
