"""Shared builders for the approval tests (not a test module)."""

from __future__ import annotations

import time
from typing import Any

from proctor.approval.base import ApprovalRequest, approval_binding
from proctor.calls import RunInfo

POLICY_SHA = "ab" * 32


def make_request(
    *,
    tool: str = "send_email",
    args: dict[str, Any] | None = None,
    call_id: str = "call_123",
    expires_in: float = 60.0,
    rules: tuple[str, ...] = ("external-mail",),
    reason: str = "mail leaving the company needs a human",
    budget: dict[str, Any] | None = None,
) -> ApprovalRequest:
    """An approval request for `tool(**args)` expiring `expires_in` seconds from now."""
    args = {"to": "bob@partner.org", "subject": "hi", "body": "hello"} if args is None else args
    return ApprovalRequest(
        call_id=call_id,
        tool=tool,
        side_effect="external",
        args=args,
        rules=rules,
        reason=reason,
        policy_sha256=POLICY_SHA,
        budget={"outbound": {"calls": 4, "cost": 19}} if budget is None else budget,
        expires_at_ns=time.time_ns() + int(expires_in * 1e9),
        binding=approval_binding(tool, args, call_id, POLICY_SHA),
        run=RunInfo(id="run_abc", step=2, principal="alice", labels={"env": "prod"}),
    )
