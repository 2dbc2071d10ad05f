"""Red team: proctor._newobj builds only what a Python class statement could have built, never a C type's instance."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

# In a child process: a C object built without its constructor crashes the interpreter on first use.
_CHILD = """
import _ssl
from proctor._newobj import maker
try:
    made = maker(_ssl._SSLSocket, (), ())
except TypeError:
    print("refused")
else:
    sock = made()  # an SSL socket whose SSL* is NULL: reading .context segfaults
    print("built", type(sock).__name__)
"""


def test_a_c_type_created_by_object_new_is_refused() -> None:
    """maker() of a C type whose __new__ is object's (instances made only from C) raises TypeError, builds nothing."""
    if importlib.util.find_spec("proctor._newobj") is None:
        pytest.fail("proctor._newobj is not built: reinstall proctor (pip install -e .) with a C compiler")
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.strip() == "refused", done.stdout
