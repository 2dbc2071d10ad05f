"""AuditLog behind the gate: the intent is on disk before the tool runs, and no intent means no call."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

import proctor.audit.log as log_module
from proctor import AuditLog, Gate, Policy, tool
from proctor.audit import verify
from proctor.errors import AuditError

POLICY = {
    "version": 1,
    "default": "deny",
    "tools": {"send": {"side_effect": "external", "redact": ["to"]}},
    "rules": [{"name": "mail", "match": {"tool": "send"}, "decision": "allow"}],
}


def _gate(path: Path, seen: list[dict[str, Any]]) -> tuple[Gate, AuditLog]:
    @tool(side_effect="external")
    def send(to: str) -> str:
        """Send a message.

        Args:
            to: Recipient.
        """
        seen.append(json.loads(path.read_bytes().splitlines()[-1]))
        return "sent"

    audit = AuditLog(path)
    return Gate(Policy.from_dict(POLICY), audit=audit, tools=[send]), audit


def test_the_tool_runs_only_after_its_redacted_intent_is_in_the_log(tmp_path: Path) -> None:
    """Inside the tool, the log's last record is already this call's intent, with redacted args."""
    path = tmp_path / "audit.jsonl"
    seen: list[dict[str, Any]] = []
    gate, audit = _gate(path, seen)
    ctx = gate.start_run(principal="alice")
    assert gate.call("send", {"to": "bob@example.com"}, context=ctx) == "sent"
    gate.finish_run(ctx)
    audit.close()
    intent = seen[0]
    assert intent["kind"] == "call_intent" and intent["tool"] == "send"
    assert "bob@example.com" not in json.dumps(intent) and "$redacted" in json.dumps(intent["args"])
    assert intent["decision"] == "allow" and intent["rules"] == ["mail"] and intent["policy_sha256"]
    report = verify(path)
    assert report.ok and report.dangling_intents == []


def test_a_failed_intent_write_refuses_the_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the intent cannot be written, the gate raises AuditError and the tool never runs."""
    path = tmp_path / "audit.jsonl"
    seen: list[dict[str, Any]] = []
    gate, audit = _gate(path, seen)
    ctx = gate.start_run()

    def full(fd: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(log_module, "write_all", full)
    with pytest.raises(AuditError):
        gate.call("send", {"to": "bob@example.com"}, context=ctx)
    assert seen == []
    audit.close()
    assert verify(path).ok
