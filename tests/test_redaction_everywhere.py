"""A redacted value never appears in clear in any byte proctor writes: audit log, side files, spans, logs.

One agent run goes through every path that could carry the value: the program text, an allowed
call, an approval (request, binding), a tool error quoting it, a validation error echoing it,
the observation fed back to the model and captured chat content.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from proctor import CallbackApprover, CodeAgent, ScriptedModel, tool
from proctor.approval import ApprovalDecision, ApprovalRequest
from proctor.policy import Policy
from proctor.telemetry.base import capture_content, set_capture_content
from proctor.telemetry.logging import configure_logging
from proctor.testing import SpanCapture

SECRET = "4111111111111111"
POLICY: dict[str, Any] = {
    "version": 1,
    "default": "deny",
    "tools": {"charge": {"side_effect": "destructive", "redact": ["card_number"]}},
    "rules": [
        {"name": "small", "match": {"tool": "charge"}, "when": "args.amount < 50", "decision": "allow"},
        {"name": "large", "match": {"tool": "charge"}, "when": "args.amount >= 50", "decision": "require_approval"},
    ],
}
PROGRAM = f'''Thought: charge the card.
```python
card = "{SECRET}"
print(charge(card_number=card, amount=10))
print(charge(card_number=card, amount=60))
try:
    charge(card_number=card, amount=500)
except Exception as e:
    print("failed:", e)
try:
    charge(card_number={SECRET}, amount=10)
except Exception as e:
    print("invalid:", e)
raise ValueError("giving up on " + card)
```'''
FINAL = '''Thought: done.
```python
final_answer("done")
```'''


@tool(side_effect="destructive")
def charge(card_number: str, amount: int) -> str:
    """Charge a card.

    Args:
        card_number: The card.
        amount: How much.
    """
    if amount > 100:
        raise ValueError(f"card {card_number} declined for {amount}")
    return f"charged {amount}"


@pytest.fixture
def logs() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    stream = io.StringIO()
    configure_logging(json=True, level="debug", stream=stream)
    yield stream
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture
def capturing() -> Iterator[None]:
    before = capture_content()
    set_capture_content(True)
    yield
    set_capture_content(before)


def _span_text(capture: SpanCapture) -> str:
    out = []
    for span in capture.spans():
        out.append(json.dumps({"name": span.name, "attributes": dict(span.attributes or {}),
                               "events": [{"name": e.name, "attributes": dict(e.attributes or {})}
                                          for e in span.events],
                               "status": span.status.description}, default=str))
    return "\n".join(out)


def test_a_redacted_value_is_in_no_byte_written(tmp_path: Path, logs: io.StringIO, capturing: None) -> None:
    """Grep the audit log, its side files, every span and every log line for the card number."""
    asked: list[ApprovalRequest] = []

    def approve(request: ApprovalRequest) -> ApprovalDecision:
        asked.append(request)
        return ApprovalDecision.approve(request, "carol")

    capture = SpanCapture()
    audit_dir = tmp_path / "audit"
    with CodeAgent([charge], ScriptedModel([PROGRAM, FINAL]), Policy.from_dict(POLICY),
                   approver=CallbackApprover(approve), audit=audit_dir / "audit.jsonl", tracer=capture.tracer,
                   sandbox="process") as agent:
        result = agent.run("charge it")
    assert result.status == "done"
    statuses = [c.status for s in result.steps for c in s.tool_calls]
    assert statuses == ["ok", "ok", "failed", "denied"]
    # Approvers see the value by default: a human cannot approve what they cannot see.
    assert [r.args["card_number"] for r in asked] == [SECRET, SECRET]

    written = {p.name: p.read_bytes() for p in audit_dir.iterdir()}
    assert {"audit.jsonl", "audit.jsonl.checkpoint"} <= set(written)
    spans, lines = _span_text(capture), logs.getvalue()
    for name, data in written.items():
        assert SECRET.encode() not in data, name
    assert SECRET not in spans
    assert SECRET not in lines
    # Not vacuous: the paths were taken and carry the scrubbed text.
    log_text = written["audit.jsonl"].decode()
    records = [json.loads(line) for line in log_text.splitlines()]
    kinds = {r["kind"] for r in records}
    assert {"approval_requested", "approval_resolved", "call_intent", "call_outcome", "step"} <= kinds
    errors = [r["error"] for r in records if r["kind"] == "call_outcome" and r["error"]]
    assert any("declined" in e and "[redacted]" in e for e in errors)
    assert any("[redacted]" in e for e in errors if "declined" not in e)  # the validation error
    step = next(r for r in records if r["kind"] == "step" and r["code"])
    assert 'card = "[redacted]"' in step["code"] and "[redacted]" in step["error"]
    assert "gen_ai.input.messages" in spans and "gen_ai.output.messages" in spans and "[redacted]" in spans


def test_the_binding_is_not_a_hash_of_the_clear_arguments(tmp_path: Path) -> None:
    """Two calls differing only in a redacted value get bindings no one can recompute from the log alone."""
    from proctor.approval.base import approval_binding
    from proctor.gate import Gate
    from proctor.testing import InMemoryAudit

    asked: list[ApprovalRequest] = []

    def approve(request: ApprovalRequest) -> ApprovalDecision:
        asked.append(request)
        return ApprovalDecision.approve(request, "carol")

    audit = InMemoryAudit()
    gate = Gate(Policy.from_dict(POLICY), approver=CallbackApprover(approve), audit=audit, tools=[charge])
    gate.call("charge", {"card_number": SECRET, "amount": 60}, call_id="c1")
    req = asked[0]
    clear = approval_binding("charge", {"card_number": SECRET, "amount": 60}, "c1", req.policy_sha256)
    assert req.binding != clear
    assert audit.of_kind("approval_requested")[0]["binding"] == req.binding


def test_a_field_hidden_from_approvers_keeps_its_value_when_left_as_shown() -> None:
    """`hide_from_approvers` shows the field redacted; an edit that leaves it as shown keeps the real value."""
    from proctor.gate import Gate

    ran: list[str] = []

    @tool(side_effect="destructive")
    def pay(card_number: str, amount: int) -> str:
        """Pay.

        Args:
            card_number: The card.
            amount: How much.
        """
        ran.append(f"{card_number}:{amount}")
        return "paid"

    policy = {**POLICY, "tools": {"pay": {"side_effect": "destructive", "redact": ["card_number"],
                                          "hide_from_approvers": ["card_number"]}},
              "rules": [{"name": "ask", "match": {"tool": "pay"}, "decision": "require_approval"}]}
    shown: list[dict[str, Any]] = []

    def edit(request: ApprovalRequest) -> ApprovalDecision:
        shown.append(dict(request.args))
        return ApprovalDecision("edit", request.binding, "carol", "halve it", args={**request.args, "amount": 5})

    gate = Gate(Policy.from_dict(policy), approver=CallbackApprover(edit), tools=[pay])
    assert gate.call("pay", {"card_number": SECRET, "amount": 10}) == "paid"
    assert SECRET not in json.dumps(shown) and "$redacted" in json.dumps(shown)
    assert ran == [f"{SECRET}:5"]
