"""Through the gate: redacted arguments and results on spans with capture on, ids on the gate's log lines."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from proctor.gate import Gate
from proctor.policy import Policy
from proctor.telemetry import set_capture_content
from proctor.telemetry.logging import configure_logging
from proctor.testing import InMemoryAudit, SpanCapture
from proctor.tools import tool

#: A redaction mark's keyed digest (random per key): masked before looking for clear values.
_MARK = re.compile(r"hmac-sha256:[0-9a-f]{64}")


@tool(side_effect="write")
def charge(card: str, amount: int) -> dict[str, Any]:
    """Charge a card.

    Args:
        card: Card number.
        amount: Cents.
    """
    return {"card": card, "amount": amount, "ok": True}


POLICY: dict[str, Any] = {
    "version": 1,
    "tools": {"charge": {"side_effect": "write", "redact": ["card"]}},
    "rules": [{"name": "charges", "match": {"tool": "charge"}, "decision": "allow"}],
}


@pytest.fixture
def capture() -> Iterator[SpanCapture]:
    set_capture_content(True)
    yield SpanCapture()
    set_capture_content(False)


def _gate(capture: SpanCapture, audit: Any = None) -> Gate:
    return Gate(Policy.from_dict(POLICY), audit=audit, tracer=capture.tracer, tools=[charge])  # type: ignore[arg-type]


def test_arguments_and_result_are_redacted_as_in_the_audit_log(capture: SpanCapture) -> None:
    """The card number never reaches the span; its keyed digest is the audit log's."""
    audit = InMemoryAudit()
    assert _gate(capture, audit).call("charge", {"card": "4111111111111111", "amount": 500})["ok"]
    attrs = capture.spans("execute_tool")[0].attributes or {}
    args = json.loads(str(attrs["gen_ai.tool.call.arguments"]))
    result = json.loads(str(attrs["gen_ai.tool.call.result"]))
    # The keyed digest is random hex that may hold "4111" by chance (about 1 run in 1,000): look past it.
    shown = str(attrs["gen_ai.tool.call.arguments"]) + str(attrs["gen_ai.tool.call.result"])
    assert "4111" not in _MARK.sub("", shown)
    assert args["amount"] == 500 and args["card"] == audit.of_kind("call_intent")[0]["args"]["card"]
    assert args["card"]["$redacted"].startswith("hmac-sha256:")
    assert result["ok"] is True and result["card"] == args["card"]
    assert attrs["gen_ai.tool.description"] == "Charge a card."


def test_nothing_is_captured_when_off() -> None:
    """Capture off (the default): no arguments, no result."""
    capture = SpanCapture()
    _gate(capture).call("charge", {"card": "4111111111111111", "amount": 1})
    attrs = capture.spans("execute_tool")[0].attributes or {}
    assert "gen_ai.tool.call.arguments" not in attrs and "gen_ai.tool.call.result" not in attrs


def test_gate_log_lines_carry_the_call_span_ids(capture: SpanCapture) -> None:
    """A gate log event about a call carries that call's trace and span ids."""
    stream = io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    configure_logging(json=True, stream=stream)
    try:
        _gate(capture, InMemoryAudit(fail_on=["call_outcome"])).call("charge", {"card": "1", "amount": 1})
    finally:
        structlog.reset_defaults()
        root.handlers[:] = handlers
        root.setLevel(level)
    span = capture.spans("execute_tool")[0]
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    lost = next(line for line in lines if line["event"] == "audit_outcome_lost")
    assert lost["trace_id"] == format(span.context.trace_id, "032x")
    assert lost["span_id"] == format(span.context.span_id, "016x")
