"""Red team: the C tokeniser keeps every object it works on alive while it uses it (no use after free)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from proctor import provenance

# Every test here starts a process (see tests/conftest.py): `make test` runs them, `make check` does not.
pytestmark = pytest.mark.process

# In a child process: the use after free crashes the interpreter as often as not.
_CHILD = """
from proctor import _provtok
key = bytes(range(16))
entries = {}
events = []

class Dropping(int):
    def __or__(self, other):
        entries.clear()  # its last reference: the C caller held it borrowed
        return 5
    __ror__ = __or__
    def __ne__(self, other):
        events.append("used")
        return True
    def __del__(self):
        events.append("freed")

token = "eve@evil.example"
entries[_provtok.digest(key, token)] = Dropping(1)
_provtok.index(key, token, entries, 2, 100, 10**6, 4096)
print(",".join(events))
"""


def test_an_entry_freed_while_its_mask_is_merged_is_not_used_after() -> None:
    """index() merging a mask into an entry whose value's __or__ drops it from the dict never touches it afterwards."""
    if provenance._native is None or not hasattr(provenance._native, "index"):
        pytest.fail("proctor._provtok is not built: reinstall proctor (pip install -e .) with a C compiler")
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"the child died ({done.returncode}): {done.stderr[-500:]}"
    events = done.stdout.strip().split(",")
    assert "freed" in events
    assert "used" not in events[events.index("freed"):], events
