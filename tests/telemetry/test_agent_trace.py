"""The trace of an agent run says what happened: usage summed once, chat spans under steps, span events."""

from __future__ import annotations

from proctor import CallbackApprover, CodeAgent, ScriptedModel, tool
from proctor.approval import ApprovalDecision, ApprovalRequest
from proctor.policy import Policy
from proctor.testing import SpanCapture

POLICY = Policy.from_dict({
    "version": 1,
    "default": "deny",
    "budgets": [{"name": "pings", "match": {"tool": "ping"}, "limit": {"calls": 3}}],
    "rules": [{"name": "pings", "match": {"tool": "ping"}, "when": "args.n < 2", "decision": "allow"},
              {"name": "ask", "match": {"tool": "ping"}, "when": "args.n >= 2", "decision": "require_approval"}],
})
STEP = '''Thought: ping.
```python
for n in range(4):
    try:
        ping(n)
    except Exception as e:
        print(e)
```'''
FINAL = '''Thought: done.
```python
final_answer("ok")
```'''


@tool(side_effect="read")
def ping(n: int) -> int:
    """Ping.

    Args:
        n: A number.
    """
    return n


def test_run_usage_is_the_sum_of_its_chat_spans_and_events_tell_the_story() -> None:
    """invoke_agent's gen_ai.usage.* equals the chat spans' sum; chats sit under steps; refusals add events."""
    capture = SpanCapture()

    def approve(request: ApprovalRequest) -> ApprovalDecision:
        return ApprovalDecision.approve(request, "carol")

    with CodeAgent([ping], ScriptedModel([STEP, FINAL]), POLICY, approver=CallbackApprover(approve),
                   tracer=capture.tracer, sandbox="process") as agent:
        result = agent.run("ping four times")
    assert result.status == "done"
    spans = capture.spans()
    run = next(s for s in spans if s.name.startswith("invoke_agent"))
    chats = [s for s in spans if s.name.startswith("chat ")]
    steps = {s.context.span_id: s for s in spans if s.name.startswith("step ")}
    assert len(chats) == 2 and all(c.parent is not None and c.parent.span_id in steps for c in chats)
    for key in ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"):
        total = sum(int((c.attributes or {})[key]) for c in chats)
        assert total > 0 and (run.attributes or {})[key] == total
        assert (run.attributes or {})[key] == result.usage.as_dict()[key.rsplit(".", 1)[1]]
    events = [[e.name for e in s.events] for s in spans if s.name == "execute_tool ping"]
    assert events == [[], [], ["proctor.approval.requested", "proctor.approval.resolved"],
                      ["proctor.budget.exhausted", "proctor.call.refused"]]
