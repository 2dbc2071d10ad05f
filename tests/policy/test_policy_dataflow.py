"""Labels, the run's `seen`, and costs computed from arguments, through a real Gate."""

from __future__ import annotations

import pytest

from proctor.calls import Call, HistoryEntry
from proctor.errors import BudgetExceeded, CallRefused, PolicyError, ToolDenied, ToolFailed
from proctor.gate import Gate
from proctor.policy import Policy
from proctor.tools import tool


@tool(side_effect="read")
def fetch_url(url: str) -> str:
    """Fetch a web page.

    Args:
        url: The address.
    """
    return f"<html>{url}</html>"


@tool(side_effect="read")
def read_inbox(folder: str = "inbox") -> list[str]:
    """Read private mail.

    Args:
        folder: Which folder.
    """
    if folder == "broken":
        raise RuntimeError("no such folder")
    return ["hello"]


@tool(side_effect="external")
def send_email(to: str, body: str) -> str:
    """Send a mail.

    Args:
        to: Recipient.
        body: Text.
    """
    return "sent"


@tool(side_effect="destructive")
def create_invoice(customer: str, amount: float) -> str:
    """Create an invoice.

    Args:
        customer: Who pays.
        amount: How much.
    """
    return f"invoice for {amount}"


TRIFECTA = {
    "version": 1,
    "default": "allow",
    "tools": {
        "fetch_url": {"labels": ["untrusted"]},
        "read_inbox": {"labels": ["private"]},
        "send_email": {"labels": ["egress"]},
    },
    "rules": [{"name": "lethal-trifecta", "match": {"side_effect": ["external", "destructive"]},
               "when": "'untrusted' in seen && 'private' in seen", "decision": "deny",
               "reason": "nothing leaves after untrusted content and private data were both read"}],
}  # fmt: skip


def test_seen_collects_labels_of_calls_that_ran() -> None:
    """Each call that ran adds its tool's labels to the run; an external call after both is denied."""
    gate = Gate(Policy.from_dict(TRIFECTA), tools=[fetch_url, read_inbox, send_email])
    ctx = gate.start_run()
    assert gate.call("send_email", {"to": "a@x.example", "body": "hi"}, context=ctx) == "sent"
    gate.call("fetch_url", {"url": "https://evil.example"}, context=ctx)
    assert ctx.seen_labels() == ("egress", "untrusted")
    assert gate.call("send_email", {"to": "a@x.example", "body": "hi"}, context=ctx) == "sent"
    gate.call("read_inbox", {}, context=ctx)
    with pytest.raises(ToolDenied, match="untrusted content and private data"):
        gate.call("send_email", {"to": "a@x.example", "body": "hi"}, context=ctx)
    assert ctx.seen_labels() == ("egress", "private", "untrusted")


def test_a_failed_call_ran_and_a_denied_one_did_not() -> None:
    """A tool that raised did run (its labels count); a refused call adds nothing to `seen`."""
    policy = Policy.from_dict({**TRIFECTA, "rules": [
        *TRIFECTA["rules"],  # type: ignore[list-item]
        {"name": "no-fetch", "match": {"tool": "fetch_url"}, "decision": "deny"}]})  # fmt: skip
    gate = Gate(policy, tools=[fetch_url, read_inbox, send_email])
    ctx = gate.start_run()
    with pytest.raises(ToolFailed):
        gate.call("read_inbox", {"folder": "broken"}, context=ctx)
    with pytest.raises(ToolDenied):
        gate.call("fetch_url", {"url": "u"}, context=ctx)
    assert ctx.seen_labels() == ("private",)
    assert [h.labels for h in ctx.history] == [("private",), ("untrusted",)]


def test_history_entries_carry_labels() -> None:
    """Conditions see each history entry's labels."""
    policy = Policy.from_dict({
        "version": 1, "default": "allow",
        "rules": [{"name": "r", "when": "history.exists(h, 'untrusted' in h.labels)", "decision": "deny"}],
    })  # fmt: skip
    entry = HistoryEntry("fetch_url", {}, "read", "allow", "ok", ("untrusted",))
    assert policy.decide(Call("x", side_effect="read", history=[entry])).outcome == "deny"
    plain = HistoryEntry("fetch_url", {}, "read", "allow", "ok")
    assert policy.decide(Call("x", side_effect="read", history=[plain])).outcome == "allow"


INVOICES = {
    "version": 1,
    "default": "allow",
    "tools": {"create_invoice": {"side_effect": "destructive", "cost": "args.amount"}},
    "budgets": [{"name": "invoiced", "match": {"tool": "create_invoice"}, "limit": {"cost": 1000}}],
}


def test_cost_from_arguments_counts_against_cost_budgets() -> None:
    """`cost: "args.amount"` charges each call its amount; the call passing the limit is refused."""
    gate = Gate(Policy.from_dict(INVOICES), tools=[create_invoice])
    ctx = gate.start_run()
    gate.call("create_invoice", {"customer": "a", "amount": 600}, context=ctx)
    gate.call("create_invoice", {"customer": "a", "amount": 399.5}, context=ctx)
    with pytest.raises(BudgetExceeded, match="invoiced") as caught:
        gate.call("create_invoice", {"customer": "a", "amount": 1}, context=ctx)
    assert caught.value.budget == "invoiced"
    assert ctx.ledger.usage()["invoiced"]["cost"] == 999.5


@pytest.mark.parametrize(
    ("expression", "message"),
    [("args.amount - 2000.0", "a negative cost"), ("args.customer", "not a number"),
     ("args.missing", "could not be computed"), ("args.amount * 1e308 * 1e308", "not a finite number")],
)
def test_bad_cost_denies_naming_the_tool(expression: str, message: str) -> None:
    """A cost expression that errors, is negative or is not a finite number denies the call, naming the tool."""
    policy = Policy.from_dict({**INVOICES, "tools": {"create_invoice": {"cost": expression}}})
    gate = Gate(policy, tools=[create_invoice])
    with pytest.raises(ToolDenied, match=f"create_invoice: denied: .*{message}"):
        gate.call("create_invoice", {"customer": "a", "amount": 5})


def test_cost_expression_is_checked_at_load_time() -> None:
    """A cost expression reading an unknown variable is a located load error."""
    with pytest.raises(PolicyError) as caught:
        Policy.from_string("version: 1\ntools:\n  t: {cost: \"history.size()\"}\n")
    issue = caught.value.issues[0]
    assert issue.line == 3
    assert "tool 't': cost: unknown variable 'history'" in issue.message


def test_policy_cost_of() -> None:
    """Policy.cost_of gives the fixed cost, the declared one, or the expression's value."""
    policy = Policy.from_dict({"version": 1, "tools": {"a": {"cost": 3}, "b": {"cost": "args.n * 2"}}})
    assert policy.cost_of("a", {}) == 3
    assert policy.cost_of("b", {"n": 4}) == 8
    assert policy.cost_of("c", {}, declared_cost=2) == 2


def test_an_edited_call_is_reserved_at_its_new_cost() -> None:
    """An approver's edit that raises the amount is charged the new amount, and refused past the budget."""
    from proctor.approval import ApprovalDecision, CallbackApprover

    policy = Policy.from_dict({**INVOICES, "rules": [
        {"name": "ask", "match": {"tool": "create_invoice"}, "decision": "require_approval"}]})  # fmt: skip

    def edit_to(amount: float) -> CallbackApprover:
        return CallbackApprover(lambda req: ApprovalDecision("edit", req.binding, "alice",
                                                             args={"customer": "a", "amount": amount}))

    gate = Gate(policy, approver=edit_to(700), tools=[create_invoice])
    ctx = gate.start_run()
    assert gate.call("create_invoice", {"customer": "a", "amount": 10}, context=ctx) == "invoice for 700.0"
    assert ctx.ledger.usage()["invoiced"]["cost"] == 700
    gate.approver = edit_to(400)
    with pytest.raises(CallRefused, match=r"edited arguments refused: .*invoiced"):
        gate.call("create_invoice", {"customer": "a", "amount": 10}, context=ctx)
    assert ctx.ledger.usage()["invoiced"]["cost"] == 700
