"""A --tools module that fails while it is imported is one located line and exit 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Every test here starts a process (see tests/conftest.py): `make test` runs them, `make check` does not.
pytestmark = pytest.mark.process

POLICY = "version: 1\ndefault: allow\n"


@pytest.mark.parametrize(("source", "expected"), [
    ("import nosuchdependency_xyz\n", "ModuleNotFoundError: No module named 'nosuchdependency_xyz' ("),
    ("x = 1\nraise RuntimeError('boom at import')\n", "RuntimeError: boom at import ("),
    ("def f(:\n    pass\n", "SyntaxError: invalid syntax ("),
])
def test_a_tools_module_that_fails_at_import_is_one_located_line(tmp_path: Path, source: str, expected: str) -> None:
    """`policy check --tools mod:x` names the module, the error and FILE:LINE, exit 2, no traceback."""
    (tmp_path / "brokentools.py").write_text(source)
    (tmp_path / "p.yaml").write_text(POLICY)
    proc = subprocess.run([sys.executable, "-c", "import sys; from proctor.cli import main; sys.exit(main())",
                           "policy", "check", "p.yaml", "--tools", "brokentools:x"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    line = proc.stderr.strip()
    assert line.count("\n") == 0 and "cannot import 'brokentools'" in line and expected in line
    assert f"brokentools.py:{source.count(chr(10)) if 'raise' in source else 1})" in line
