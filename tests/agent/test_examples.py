"""The example scripts run offline (scripted models) and end as their docstrings say."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from proctor.audit import verify

# Every test here starts a process (see tests/conftest.py): `make test` runs them, `make check` does not.
pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("script", "args", "expected"), [
    ("support_agent.py", [], ["refunded (RF-", "escalated: ApprovalDenied", "status"]),
    ("analytics_agent.py", [], ["cleanup refused", "exports must not contain personal data", "done"]),
    ("finance_agent.py", ["--yes"], ["approved by the approver", "denied by policy", "done"]),
    ("smolagents_agent.py", [], ["parties over six are booked by phone", "answer: booked Terraço for 6"]),
    ("vision_agent.py", [], ["image from screenshot: PNG 320x200", "image with the task: PNG 320x200",
                             "deny no-public-bugs", "bug filed on the internal tracker", "proctor audit show"]),
    ("research_team.py", [], ["researcher's own policy: the researcher reads only the documentation site",
                              "the researcher only reads", "mail sent: ['team@example.com']"]),
])
def test_example_runs_offline(script: str, args: list[str], expected: list[str], tmp_path: Path) -> None:
    """Each example exits 0 without a terminal and writes an audit log that verifies."""
    audit = tmp_path / "audit.jsonl"
    env = {**os.environ, "COLUMNS": "200"}  # no wrapping of the texts looked for
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), "--audit", str(audit), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for text in expected:
        assert text in proc.stdout, text
    assert verify(audit).ok
