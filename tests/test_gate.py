"""Tests for proctor.gate: the order of steps, refusals, approvals, budgets, concurrency."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter
from typing import Any

import pytest

from proctor.approval import ApprovalDecision, ApprovalRequest, CallbackApprover, Grant
from proctor.errors import (
    ApprovalDenied,
    ApprovalTimeout,
    AuditError,
    BudgetExceeded,
    CallRefused,
    ToolDenied,
    ToolFailed,
)
from proctor.gate import Gate
from proctor.policy import Policy
from proctor.testing import InMemoryAudit
from proctor.tools import tool

RUNS: Counter[str] = Counter()


@tool(side_effect="read")
def lookup(order: str) -> str:
    """Look an order up.

    Args:
        order: Order id.
    """
    RUNS["lookup"] += 1
    return f"order {order}: shipped"


@tool(side_effect="external", cost=1)
def send_email(to: str, body: str) -> str:
    """Send an email.

    Args:
        to: Recipient.
        body: Text.
    """
    RUNS["send_email"] += 1
    return f"sent to {to}"


@tool(side_effect="destructive")
def wipe(target: str) -> str:
    """Wipe something.

    Args:
        target: What.
    """
    RUNS["wipe"] += 1
    return "wiped"


@tool(side_effect="read")
def broken(x: int) -> int:
    """Always fails.

    Args:
        x: Anything.
    """
    raise ValueError(f"no such thing as {x}")


@tool(side_effect="read")
def slow(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "woke"


@tool(side_effect="read")
async def afetch(url: str) -> str:
    """Fetch asynchronously.

    Args:
        url: Address.
    """
    await asyncio.sleep(0)
    return f"fetched {url}"


POLICY: dict[str, Any] = {
    "version": 1,
    "default": "deny",
    "tools": {"slow": {"side_effect": "read", "timeout": "100ms"}, "send_email": {"redact": ["body"]}},
    "budgets": [{"name": "mail", "match": {"tool": "send_email"}, "limit": {"calls": 2}}],
    "rules": [
        {"name": "reads", "match": {"side_effect": ["none", "read"]}, "decision": "allow"},
        {"name": "internal-mail", "match": {"tool": "send_email"},
         "when": "args.to.endsWith('@example.com')", "decision": "allow"},
        {"name": "external-mail", "match": {"tool": "send_email"},
         "when": "!args.to.endsWith('@example.com')", "decision": "require_approval",
         "reason": "mail leaving the company needs a human"},
        {"name": "no-wipe", "match": {"tool": "wipe"}, "decision": "deny", "reason": "never"},
    ],
    "approval": {"timeout": "5s"},
}

TOOLS = [lookup, send_email, wipe, broken, slow, afetch]


@pytest.fixture(autouse=True)
def _reset_runs() -> None:
    RUNS.clear()


def make_gate(approver: Any = None, audit: Any = None, policy: dict[str, Any] | None = None) -> Gate:
    return Gate(Policy.from_dict(policy or POLICY), approver=approver, audit=audit, tools=TOOLS)


def test_allowed_call_runs_and_is_audited_before_and_after() -> None:
    """An allowed call runs once, with its intent recorded before its outcome."""
    audit = InMemoryAudit()
    gate = make_gate(audit=audit)
    assert gate.call("lookup", {"order": "A1"}) == "order A1: shipped"
    assert RUNS["lookup"] == 1
    assert audit.kinds() == ["run_started", "call_intent", "call_outcome"]
    intent = audit.of_kind("call_intent")[0]
    assert intent["decision"] == "allow" and intent["rules"] == ["reads"]
    assert intent["durable"] is False  # a read's intent is flushed, not fsynced, by default (read_durability)
    assert intent["policy_sha256"] == gate.policy.sha256
    assert audit.of_kind("call_outcome")[0]["status"] == "ok"


def test_side_effecting_calls_keep_a_durable_intent_and_reads_can_too() -> None:
    """A call with effects has its intent fsynced before it runs, its outcome only written; reads can be fsynced."""
    audit = InMemoryAudit()
    make_gate(audit=audit).call("send_email", {"to": "a@example.com", "body": "b"})
    assert audit.of_kind("call_intent")[0]["durable"] is True
    assert audit.of_kind("call_outcome")[0]["durable"] is False  # made durable by the next durable record
    strict = InMemoryAudit()
    make_gate(audit=strict, policy={**POLICY, "read_durability": "fsync"}).call("lookup", {"order": "A1"})
    assert strict.of_kind("call_intent")[0]["durable"] is True


def test_denied_call_never_runs_and_names_the_rule() -> None:
    """A deny raises ToolDenied naming the reason and rule; the tool does not run."""
    gate = make_gate()
    with pytest.raises(ToolDenied, match="never") as info:
        gate.call("wipe", {"target": "db"})
    assert info.value.rules == ("no-wipe",)
    assert RUNS["wipe"] == 0


def test_unknown_tool_is_denied() -> None:
    """A tool the gate does not know is denied, listing the known ones."""
    outcome = make_gate().submit("rm_rf", {})
    assert isinstance(outcome.error, ToolDenied)
    assert "unknown tool 'rm_rf'" in str(outcome.error)
    assert outcome.record.status == "denied"


def test_invalid_arguments_are_refused_before_the_policy() -> None:
    """Arguments that do not fit the schema are refused with the argument named."""
    outcome = make_gate().submit("lookup", {"ordr": "A1"})
    assert isinstance(outcome.error, ToolDenied)
    assert "missing argument 'order'" in str(outcome.error)
    assert outcome.record.decision is None


def test_non_mapping_arguments_are_refused() -> None:
    """Arguments must be a mapping (a forged request could send anything)."""
    outcome = make_gate().submit("lookup", ["A1"])  # type: ignore[arg-type]
    assert isinstance(outcome.error, ToolDenied)


def test_tool_exception_becomes_tool_failed() -> None:
    """An exception inside a tool comes back as ToolFailed with the tool's message."""
    gate = make_gate()
    with pytest.raises(ToolFailed, match="ValueError: no such thing as 3") as info:
        gate.call("broken", {"x": 3})
    assert info.value.error_type == "ValueError"
    assert gate.default_context().records[-1].status == "failed"


def test_tool_timeout_from_policy() -> None:
    """tools.NAME.timeout bounds a sync tool; the call ends as a timeout."""
    gate = make_gate()
    began = time.perf_counter()
    outcome = gate.submit("slow", {"seconds": 1.0})
    assert time.perf_counter() - began < 0.6
    assert isinstance(outcome.error, ToolFailed)
    assert outcome.record.status == "timeout"


def test_async_tool_from_sync_and_async_callers() -> None:
    """An async tool runs from gate.call and from await gate.acall."""
    gate = make_gate()
    assert gate.call("afetch", {"url": "u"}) == "fetched u"
    assert asyncio.run(gate.acall("afetch", {"url": "v"})) == "fetched v"


def test_audit_failure_refuses_the_call() -> None:
    """When the intent cannot be recorded, the tool does not run."""
    gate = make_gate(audit=InMemoryAudit(fail_on={"call_intent"}))
    with pytest.raises(AuditError, match="could not record the call before it ran"):
        gate.call("lookup", {"order": "A1"})
    assert RUNS["lookup"] == 0


def test_start_run_refused_without_audit() -> None:
    """A run that cannot be recorded does not start."""
    gate = make_gate(audit=InMemoryAudit(fail_on={"run_started"}))
    with pytest.raises(AuditError):
        gate.start_run()


def test_history_reaches_conditions() -> None:
    """Earlier calls of the run are visible to `history` in conditions."""
    policy = dict(POLICY)
    policy["rules"] = [
        *POLICY["rules"],
        {"name": "no-exfil", "match": {"side_effect": ["external"]},
         "when": "history.exists(c, c.tool == 'lookup')", "decision": "deny", "reason": "looked up"},
    ]
    gate = make_gate(policy=policy)
    ctx = gate.start_run()
    gate.call("send_email", {"to": "a@example.com", "body": "x"}, context=ctx)
    gate.call("lookup", {"order": "A1"}, context=ctx)
    with pytest.raises(ToolDenied, match="looked up"):
        gate.call("send_email", {"to": "a@example.com", "body": "x"}, context=ctx)
    other = gate.start_run()
    gate.call("send_email", {"to": "a@example.com", "body": "x"}, context=other)


def test_redaction_applies_to_records_and_audit() -> None:
    """Fields the policy redacts never reach the audit or call records in clear."""
    audit = InMemoryAudit()
    gate = make_gate(audit=audit)
    outcome = gate.submit("send_email", {"to": "a@example.com", "body": "secret"})
    assert outcome.value == "sent to a@example.com"
    assert "secret" not in repr(audit.records)
    assert "secret" not in repr(outcome.record)


# -- the matrix ------------------------------------------------------------------------------------

ANSWERS = ["approve", "deny", "edit", "grant", "timeout", "channel_error"]


def answer_with(kind: str, asked: list[ApprovalRequest]) -> CallbackApprover:
    def fn(req: ApprovalRequest) -> ApprovalDecision:
        asked.append(req)
        if kind == "approve":
            return ApprovalDecision.approve(req, "alice")
        if kind == "deny":
            return ApprovalDecision.deny(req, "alice", "not today")
        if kind == "edit":
            return ApprovalDecision("edit", req.binding, "alice", args={"to": "b@partner.com", "body": "edited"})
        if kind == "grant":
            return ApprovalDecision("grant", req.binding, "alice", grant=Grant(req.tool))
        if kind == "timeout":
            return ApprovalDecision.deny(req, "timeout", "no answer", timed_out=True)
        raise ConnectionError("webhook unreachable")

    return CallbackApprover(fn)


EXPECTED_APPROVAL: dict[str, type[CallRefused] | None] = {
    "approve": None, "deny": ApprovalDenied, "edit": None, "grant": None,
    "timeout": ApprovalTimeout, "channel_error": ApprovalDenied,
}
TARGET = {"allow": "a@example.com", "require_approval": "x@partner.com"}


@pytest.mark.parametrize(
    ("outcome", "answer", "budget"),
    list(itertools.product(["allow", "deny", "require_approval"], ANSWERS, ["left", "spent"])),
)
def test_matrix(outcome: str, answer: str, budget: str) -> None:
    """Each decision, approval answer and budget state gives its documented result, running the tool only then."""
    asked: list[ApprovalRequest] = []
    gate = make_gate(approver=answer_with(answer, asked))
    ctx = gate.start_run()
    if budget == "spent":
        for _ in range(2):
            gate.call("send_email", {"to": "a@example.com", "body": "fill"}, context=ctx)
        RUNS.clear()
    if outcome == "deny":
        result = gate.submit("wipe", {"target": "db"}, context=ctx)
        assert isinstance(result.error, ToolDenied) and RUNS["wipe"] == 0 and not asked
        return
    result = gate.submit("send_email", {"to": TARGET[outcome], "body": "hello"}, context=ctx)
    if budget == "spent":
        assert isinstance(result.error, BudgetExceeded) and result.error.budget == "mail"
        assert result.record.budget == "mail"
        assert RUNS["send_email"] == 0 and not asked, "no human is asked for a call over budget"
        return
    if outcome == "allow":
        assert result.error is None and RUNS["send_email"] == 1 and not asked
        return
    assert len(asked) == 1
    expected = EXPECTED_APPROVAL[answer]
    if expected is None:
        assert result.error is None and RUNS["send_email"] == 1
        if answer == "edit":
            assert result.value == "sent to b@partner.com"
            assert result.record.approval == "edit by alice"
    else:
        assert type(result.error) is expected and RUNS["send_email"] == 0
        assert ctx.ledger.usage()["mail"]["calls"] == 0, "a refused call gives its budget back"


def test_grant_approves_later_calls_of_the_run_only() -> None:
    """A grant answers later calls of the same run without asking, and no other run."""
    asked: list[ApprovalRequest] = []
    gate = make_gate(approver=answer_with("grant", asked))
    ctx = gate.start_run()
    gate.call("send_email", {"to": "x@partner.com", "body": "1"}, context=ctx)
    gate.call("send_email", {"to": "y@partner.com", "body": "2"}, context=ctx)
    assert len(asked) == 1
    assert ctx.records[-1].approval == "grant by grant"
    gate.call("send_email", {"to": "z@partner.com", "body": "3"}, context=gate.start_run())
    assert len(asked) == 2


def test_grant_with_pattern_covers_only_matching_arguments() -> None:
    """A grant limited to a pattern does not cover other arguments."""
    asked: list[ApprovalRequest] = []

    def fn(req: ApprovalRequest) -> ApprovalDecision:
        asked.append(req)
        return ApprovalDecision("grant", req.binding, "alice", grant=Grant("send_email", {"to": "*@partner.com"}))

    gate = make_gate(approver=CallbackApprover(fn), policy={**POLICY, "budgets": []})
    ctx = gate.start_run()
    gate.call("send_email", {"to": "x@partner.com", "body": "1"}, context=ctx)
    gate.call("send_email", {"to": "y@partner.com", "body": "1"}, context=ctx)
    gate.call("send_email", {"to": "y@other.org", "body": "1"}, context=ctx)
    assert [r.args["to"] for r in asked] == ["x@partner.com", "y@other.org"]


def test_answer_bound_to_another_call_is_rejected() -> None:
    """An approval for different arguments, another call or another policy is a deny."""
    def fn(req: ApprovalRequest) -> ApprovalDecision:
        return ApprovalDecision("approve", "0" * 64, "mallory")

    gate = make_gate(approver=CallbackApprover(fn))
    with pytest.raises(ApprovalDenied, match="bound to another call"):
        gate.call("send_email", {"to": "x@partner.com", "body": "1"})
    assert RUNS["send_email"] == 0


def test_edit_goes_through_the_policy_again() -> None:
    """Edited arguments the policy denies do not run."""
    policy = dict(POLICY)
    policy["rules"] = [*POLICY["rules"], {"name": "no-evil", "match": {"tool": "send_email"},
                                          "when": "args.to == 'evil@bad.org'", "decision": "deny"}]

    def fn(req: ApprovalRequest) -> ApprovalDecision:
        return ApprovalDecision("edit", req.binding, "alice", args={"to": "evil@bad.org", "body": "x"})

    gate = make_gate(approver=CallbackApprover(fn), policy=policy)
    with pytest.raises(ApprovalDenied, match="edited arguments denied"):
        gate.call("send_email", {"to": "x@partner.com", "body": "1"})
    assert RUNS["send_email"] == 0


def test_no_approver_means_deny() -> None:
    """require_approval without an approver is refused, saying so."""
    with pytest.raises(ApprovalDenied, match="no approver is configured"):
        make_gate().call("send_email", {"to": "x@partner.com", "body": "1"})


def test_approval_request_carries_what_a_human_needs() -> None:
    """The request names the call, class, clear args, rules, reason, policy, budget and expiry."""
    asked: list[ApprovalRequest] = []
    gate = make_gate(approver=answer_with("approve", asked))
    gate.call("send_email", {"to": "x@partner.com", "body": "secret"})
    req = asked[0]
    assert req.tool == "send_email" and req.side_effect == "external"
    assert req.rules == ("external-mail",) and req.reason == "mail leaving the company needs a human"
    assert req.args == {"to": "x@partner.com", "body": "secret"}  # a human sees what is approved
    assert "secret" not in req.binding
    assert req.policy_sha256 == gate.policy.sha256
    assert req.budget["mail"]["calls"] == 1
    assert req.expires_at_ns > time.time_ns()


def test_threads_never_overshoot_a_budget() -> None:
    """Many threads calling at once run the tool exactly as often as the budget allows."""
    policy = dict(POLICY)
    policy["budgets"] = [{"name": "mail", "match": {"tool": "send_email"}, "limit": {"calls": 25}}]
    gate = make_gate(policy=policy)
    ctx = gate.start_run()
    results: list[Any] = []
    barrier = threading.Barrier(16)

    def worker(n: int) -> None:
        barrier.wait()
        for i in range(10):
            out = gate.submit("send_email", {"to": f"t{n}-{i}@example.com", "body": "x"}, context=ctx)
            results.append((n, i, out))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [r for r in results if r[2].error is None]
    assert len(ok) == 25 == RUNS["send_email"]
    assert all(out.value == f"sent to t{n}-{i}@example.com" for n, i, out in ok), "replies never mixed up"
    assert all(isinstance(out.error, BudgetExceeded) for _, _, out in results if out.error is not None)
    assert len(ctx.records) == 160


def test_an_approver_that_never_answers_times_out() -> None:
    """The policy's approval timeout holds even when the approver hangs: the call is refused, not stuck."""
    release = threading.Event()

    def hang(req: ApprovalRequest) -> bool:
        release.wait(10)
        return True

    gate = make_gate(approver=CallbackApprover(hang), policy={**POLICY, "approval": {"timeout": "200ms"}})
    began = time.perf_counter()
    with pytest.raises(ApprovalTimeout, match="within the approval timeout"):
        gate.call("send_email", {"to": "x@partner.com", "body": "1"})
    assert time.perf_counter() - began < 3
    release.set()
    assert RUNS["send_email"] == 0


def test_on_result_answers_before_the_outcome_is_recorded() -> None:
    """on_result gets the value, or the ToolFailed, after the intent and before the outcome is written."""
    audit = InMemoryAudit()
    gate = Gate(Policy.from_dict(POLICY), audit=audit, tools=[lookup, broken, wipe])
    seen: list[tuple[Any, Any, list[str]]] = []
    answer = lambda value, error: seen.append((value, error, audit.kinds()))  # noqa: E731
    assert gate.submit("lookup", {"order": "a1"}, on_result=answer).value == "order a1: shipped"
    failed = gate.submit("broken", {"x": 3}, on_result=answer)
    assert seen[0][:2] == ("order a1: shipped", None) and seen[0][2][-1] == "call_intent"
    assert isinstance(seen[1][1], ToolFailed) and seen[1][1] is failed.error and seen[1][2][-1] == "call_intent"
    assert audit.kinds()[-1] == "call_outcome"
    refused = gate.submit("wipe", {"target": "x"}, on_result=answer)
    assert isinstance(refused.error, ToolDenied) and len(seen) == 2  # a call that did not run is not answered early


def test_a_raising_on_result_is_logged_and_the_call_still_recorded() -> None:
    """An on_result that raises changes nothing: the outcome is recorded and returned."""
    audit = InMemoryAudit()
    gate = Gate(Policy.from_dict(POLICY), audit=audit, tools=[lookup])

    def answer(value: Any, error: Any) -> None:
        raise RuntimeError("channel gone")

    outcome = gate.submit("lookup", {"order": "a1"}, on_result=answer)
    assert outcome.error is None and outcome.record.status == "ok"
    assert audit.kinds()[-2:] == ["call_intent", "call_outcome"]
