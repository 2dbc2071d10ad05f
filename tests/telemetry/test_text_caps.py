"""Text leaving the gate is capped: span status, attributes, events and audit error text, with a digest of the cut."""

from __future__ import annotations

import hashlib

import pytest

from proctor.errors import ToolDenied, ToolFailed
from proctor.gate import Gate
from proctor.policy import Policy
from proctor.testing import InMemoryAudit, SpanCapture
from proctor.textcaps import MAX_AUDIT_ERROR, MAX_SPAN_TEXT, cap_attribute, cap_text, error_fields
from proctor.tools import tool

HUGE = "x" * 6_000_000
SLACK = 200  # the cut marker


@tool(side_effect="read")
def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: The key.
    """
    raise ValueError("no such key: " + key)


def _gate(capture: SpanCapture, audit: InMemoryAudit) -> Gate:
    policy = Policy.from_dict({"version": 1, "rules": [{"name": "reads", "match": {"side_effect": "read"},
                                                         "decision": "allow"}]})
    return Gate(policy, audit=audit, tools=[lookup], tracer=capture.tracer)


def _sizes(capture: SpanCapture) -> list[int]:
    """Every string a tool span carries: status, attributes, event attributes."""
    out: list[int] = []
    for span in capture.spans("execute_tool"):
        out.append(len(span.status.description or ""))
        for value in (span.attributes or {}).values():
            out.extend(len(v) for v in (value if isinstance(value, tuple) else (value,)) if isinstance(v, str))
        for event in span.events:
            out.extend(len(v) for v in (event.attributes or {}).values() if isinstance(v, str))
    return out


def test_a_failing_tool_with_a_6mb_message_is_capped_everywhere() -> None:
    """The tool's 6 MB error becomes a capped span status/event and a capped audit error with its digest."""
    capture, audit = SpanCapture(), InMemoryAudit()
    gate = _gate(capture, audit)
    ctx = gate.start_run()
    with pytest.raises(ToolFailed):
        gate.call("lookup", {"key": HUGE}, context=ctx)
    assert max(_sizes(capture)) <= 4 * MAX_SPAN_TEXT + SLACK
    (span,) = capture.spans("execute_tool")
    assert len(span.status.description or "") <= MAX_SPAN_TEXT + SLACK
    assert "[cut: " in (span.status.description or "")
    outcome = next(r for r in audit.records if r["kind"] == "call_outcome")
    assert len(outcome["error"]) <= MAX_AUDIT_ERROR + 1
    full = "lookup: ValueError: no such key: " + HUGE  # the error the program sees, whole
    assert outcome["error"] == full[:MAX_AUDIT_ERROR] + "…"
    assert outcome["error_cut"] == {"chars": len(full), "sha256": hashlib.sha256(full.encode()).hexdigest()}


def test_an_invalid_call_quoting_a_huge_argument_is_capped() -> None:
    """A refusal whose message quotes a 6 MB argument (unknown argument name) is capped in spans and audit."""
    capture, audit = SpanCapture(), InMemoryAudit()
    gate = _gate(capture, audit)
    ctx = gate.start_run()
    with pytest.raises(ToolDenied):
        gate.call("lookup", {HUGE: 1}, context=ctx)
    assert max(_sizes(capture)) <= 4 * MAX_SPAN_TEXT + SLACK
    for record in audit.records:
        if record.get("error") is not None:
            assert len(record["error"]) <= MAX_AUDIT_ERROR + 1


def test_earlier_spans_survive_a_huge_one_in_the_same_batch() -> None:
    """Calls before and after a huge failure all export; the batch stays small."""
    capture, audit = SpanCapture(), InMemoryAudit()
    gate = _gate(capture, audit)
    ctx = gate.start_run()
    for key in ("a", HUGE, "b"):
        with pytest.raises(ToolFailed):
            gate.call("lookup", {"key": key}, context=ctx)
    spans = capture.spans("execute_tool")
    assert len(spans) == 3
    assert sum(_sizes(capture)) < 64 * 1024


def test_cap_helpers() -> None:
    """cap_text names length and digest; lists are shortened; short text and None are untouched."""
    assert cap_text("short") == "short"
    capped = cap_text("y" * 10_000, 100)
    assert capped.startswith("y" * 100 + "… [cut: 10000 chars, sha256 ")
    assert hashlib.sha256(b"y" * 10_000).hexdigest() in capped
    assert cap_attribute(["r"] * 500)[-1] == "… [cut: 372 more items]"
    assert error_fields(None) == {"error": None}
    assert error_fields("boom") == {"error": "boom"}
    fields = error_fields("z" * 9000, 10)
    assert fields["error"] == "z" * 10 + "…"
    assert fields["error_cut"] == {"chars": 9000, "sha256": hashlib.sha256(b"z" * 9000).hexdigest()}
