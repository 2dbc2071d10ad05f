"""docs/audit.md: its independent verifier accepts real logs and rejects tampered ones."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from audit_helpers import signing_key
from cryptography.hazmat.primitives import serialization

from proctor.audit import AuditLog, verify

DOC = Path(__file__).resolve().parents[2] / "docs" / "audit.md"


def _snippet() -> dict[str, Any]:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    code = next(b for b in blocks if "def check(" in b)
    namespace: dict[str, Any] = {}
    exec(compile(code, str(DOC), "exec"), namespace)
    return namespace


def test_the_documented_verifier_agrees_with_proctor(tmp_path: Path) -> None:
    """The doc's stand-alone verifier accepts a signed log and computes the same root as verify."""
    path = tmp_path / "a.jsonl"
    with AuditLog(path, signing_key=signing_key(), checkpoint_every=3) as log:
        for i in range(10):
            log.append("call_intent", {"call_id": f"c{i}", "tool": "t", "args": {"to": "zoë@example.com", "n": i}})
            log.append("call_outcome", {"call_id": f"c{i}", "status": "ok"})
    pub = signing_key().public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()
    count, root = _snippet()["check"](path, pub)
    report = verify(path)
    assert (count, root) == (report.records, report.root)


def test_the_documented_verifier_rejects_a_tampered_log(tmp_path: Path) -> None:
    """The doc's verifier fails on an edited record."""
    path = tmp_path / "a.jsonl"
    with AuditLog(path) as log:
        log.append("step", {"step": 1})
    path.write_bytes(path.read_bytes().replace(b'"step":1', b'"step":2'))
    with pytest.raises(AssertionError, match="bad h"):
        _snippet()["check"](path)
