"""A program's governed calls under a shadow policy: answered first, then decided by the candidate, in order."""

from __future__ import annotations

from proctor.gate import Gate
from proctor.interpreter import Interpreter
from proctor.policy import Policy
from proctor.testing import InMemoryAudit
from proctor.tools import tool


@tool(side_effect="external")
def send_email(to: str) -> str:
    """Send a mail.

    Args:
        to: Recipient.
    """
    return f"sent to {to}"


ENFORCED = {"version": 1, "rules": [{"name": "mail", "match": {"tool": "send_email"}, "decision": "allow"}]}
CANDIDATE = {"version": 1, "rules": [
    {"name": "internal-only", "match": {"tool": "send_email"}, "when": "!args.to.endsWith('@example.com')",
     "decision": "deny"},
    {"name": "mail", "match": {"tool": "send_email"}, "decision": "allow"}]}


def test_a_programs_calls_are_answered_then_shadowed_in_order() -> None:
    audit = InMemoryAudit()
    gate = Gate(Policy.from_dict(ENFORCED), audit=audit, shadow=Policy.from_dict(CANDIDATE), tools=[send_email])
    with Interpreter([send_email], gate, sandbox="process") as py:
        result = py.run("a = send_email('eve@evil.example')\nb = send_email('bob@example.com')\n"
                        "c = send_email('mallory@evil.example')\nprint(a, b, c)")
    assert result.error is None, result.error
    assert result.logs.strip() == "sent to eve@evil.example sent to bob@example.com sent to mallory@evil.example"
    calls = [r["call_id"] for r in audit.of_kind("call_intent")]
    shadowed = audit.of_kind("shadow_decision")
    assert [r["call_id"] for r in shadowed] == [calls[0], calls[2]]
    assert all(r["shadow"]["rules"] == ["internal-only"] for r in shadowed)
    order = [(r["kind"], r.get("call_id")) for r in audit.records]
    for i in (0, 2):  # decided once the call's outcome is recorded (its answer went before), before the next call
        at = order.index(("shadow_decision", calls[i]))
        assert order.index(("call_outcome", calls[i])) < at
        if i + 1 < len(calls):
            assert at < order.index(("call_intent", calls[i + 1]))
