"""Tests for CallbackApprover."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from approval_helpers import make_request

from proctor.approval import ApprovalDecision, ApprovalRequest, Approver, CallbackApprover, Grant


def test_true_approves_with_the_callback_name() -> None:
    """A True answer approves, bound to the request, decided by 'callback'."""
    req = make_request()
    decision = CallbackApprover(lambda r: True).request(req)
    assert (decision.verdict, decision.binding, decision.approver) == ("approve", req.binding, "callback")


def test_false_denies_saying_so() -> None:
    """A False answer denies with the reason 'callback said no'."""
    decision = CallbackApprover(lambda r: False, name="policy-bot").request(make_request())
    assert (decision.verdict, decision.reason, decision.approver) == ("deny", "callback said no", "policy-bot")


def test_decision_passes_through_and_gets_the_name_when_unnamed() -> None:
    """A returned decision is kept as is; only an unset approver is filled in, and how it was proven
    is stamped: a callback's word (whatever method it claimed)."""
    req = make_request()
    grant = ApprovalDecision("grant", req.binding, reason="ok", grant=Grant("send_email", {"to": "*@partner.org"}))
    decision = CallbackApprover(lambda r: grant, name="bot").request(req)
    assert decision.verdict == "grant" and decision.approver == "bot" and decision.grant == grant.grant
    named = ApprovalDecision.approve(req, "carol", method="token")
    assert CallbackApprover(lambda r: named).request(req) == dataclasses.replace(named, method="callback")


def test_decision_bound_to_another_call_is_passed_through() -> None:
    """A decision for another call is not rewritten here: the gate sees the wrong binding and rejects it."""
    other = make_request(call_id="call_other")
    decision = CallbackApprover(lambda r: ApprovalDecision.approve(other, "bot")).request(make_request())
    assert decision.binding == other.binding != make_request().binding


def test_exception_denies_naming_it() -> None:
    """An exception inside the callback is a deny naming the exception, never a raise."""

    def boom(request: ApprovalRequest) -> bool:
        raise LookupError("no such ticket")

    decision = CallbackApprover(boom).request(make_request())
    assert decision.verdict == "deny"
    assert decision.reason == "callback raised LookupError: no such ticket"


@pytest.mark.parametrize("value", [None, 1, "yes", {"verdict": "approve"}])
def test_other_return_values_deny(value: object) -> None:
    """Anything but a bool or a decision denies (1 is not True)."""
    decision = CallbackApprover(lambda r: value).request(make_request())  # type: ignore[arg-type, return-value]
    assert decision.verdict == "deny" and "expected ApprovalDecision or bool" in decision.reason


def test_async_callback_runs_outside_a_loop_and_denies_inside_one() -> None:
    """A coroutine callback runs to completion without a loop; inside a running loop it denies."""

    async def decide(request: ApprovalRequest) -> bool:
        await asyncio.sleep(0)
        return True

    approver = CallbackApprover(decide)  # type: ignore[arg-type]
    assert approver.request(make_request()).verdict == "approve"

    async def inside() -> ApprovalDecision:
        return approver.request(make_request())

    decision = asyncio.run(inside())
    assert decision.verdict == "deny" and "running event loop" in decision.reason


def test_is_an_approver_and_rejects_non_callables() -> None:
    """It satisfies the Approver protocol; a non-callable is refused up front."""
    assert isinstance(CallbackApprover(lambda r: True), Approver)
    with pytest.raises(TypeError):
        CallbackApprover("yes")  # type: ignore[arg-type]

