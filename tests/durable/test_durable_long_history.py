"""A durable run resumed after more calls than its history keeps still means "never twice" (issue 34, point 6)."""

from __future__ import annotations

import pytest

from proctor.agent.durable import restore_context, snapshot_history
from proctor.calls import RunInfo
from proctor.errors import ToolDenied
from proctor.gate import Gate
from proctor.policy import Policy
from proctor.store import RunRecord
from proctor.tools import tool


@tool(side_effect="destructive")
def refund(order: int) -> str:
    """Refund an order.

    Args:
        order: The order.
    """
    return f"refunded {order}"


POLICY = Policy.from_dict({"version": 1, "rules": [
    {"name": "refunds", "match": {"tool": "refund"}, "decision": "allow"},
    {"name": "never-twice", "match": {"tool": "refund"},
     "when": "history.exists(h, h.tool == 'refund' && h.args.order == args.order)", "decision": "deny",
     "reason": "an order is refunded once"}]})


def test_a_resumed_run_that_had_dropped_rows_does_not_allow_a_second_refund() -> None:
    gate = Gate(POLICY, tools=[refund], history_limit=5)
    ctx = gate.start_run(principal="alice")
    for order in range(1, 13):  # past 2 x history_limit: the first rows are dropped
        gate.call("refund", {"order": order}, context=ctx)
    rows = snapshot_history(ctx)
    assert len(rows) < ctx.calls_made
    record = RunRecord(run_id=ctx.info.id, task="t", history=rows, history_dropped=ctx.calls_made - len(rows))
    resumed = gate.resume_run(RunInfo(id=ctx.info.id, principal="alice"))
    restore_context(resumed, record)
    with pytest.raises(ToolDenied):  # refunded at call #1, dropped before the save: never allowed again
        gate.call("refund", {"order": 1}, context=resumed)
    with pytest.raises(ToolDenied):  # still kept: refused by the rule itself
        gate.call("refund", {"order": 12}, context=resumed)
