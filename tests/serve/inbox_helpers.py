"""A real durable run waiting for a human, and an inbox over its store, for the inbox tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proctor import CodeAgent, InboxApprover, Policy, RunStore, ScriptedModel, tool
from proctor.approval.tokens import add_token
from proctor.policy.approvers import os_account
from proctor.store import AnswerSeal

SENT: list[tuple[str, str]] = []  # every real send, on the host


@tool(side_effect="read")
def lookup(customer: str) -> str:
    """Look a customer up.

    Args:
        customer: Customer name.
    """
    return f"{customer} <{customer}@partner.org>"


@tool(side_effect="external")
def send(to: str, body: str) -> str:
    """Send a message.

    Args:
        to: Recipient address.
        body: Text.
    """
    SENT.append((to, body))
    return f"sent to {to}"


POLICY = {
    "version": 1,
    "default": "deny",
    "tools": {"lookup": {"side_effect": "read"}, "send": {"side_effect": "external"}},
    "rules": [
        {"name": "reads", "match": {"side_effect": "read"}, "decision": "allow"},
        {"name": "outbound-mail", "match": {"tool": "send"}, "decision": "require_approval",
         "reason": "mail leaving the company needs a human"},
    ],
    # The CLI tests answer through the store as this OS account, `--as` the approvers they name.
    "approval": {"os_users": {os_account(): {"as": ["bob", "carol", "bartholomew.approver-on-call"]}}},
}

PROGRAM = ("Thought: find the address, then write.\n```python\nwho = lookup('carol')\n"
           "r = send(to='carol@partner.org', body='your invoice')\nfinal_answer(r)\n```")


@dataclass
class Inbox:
    """A store with one suspended run of alice's and a token file with alice and bob."""

    tmp: Path
    store_url: str = ""
    tokens_path: Path = field(default_factory=Path)
    tokens: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.store_url = f"sqlite:///{self.tmp}/runs.db"
        self.tokens_path = self.tmp / "tokens.txt"
        for name in ("alice", "bob"):
            self.tokens[name] = add_token(self.tokens_path, name)

    @property
    def answers(self) -> AnswerSeal:
        """What the inbox seals answers with: the key of the runs' trail (``audit.jsonl`` here) for answers."""
        return AnswerSeal.of_trail(str(self.tmp / "audit.jsonl"), create=True)

    def agent(self, store: RunStore, *, wait: str = "0s", responses: Any = None) -> CodeAgent:
        return CodeAgent([lookup, send], ScriptedModel(responses or [PROGRAM]), Policy.from_dict(POLICY),
                         approver=InboxApprover(store, wait=wait), audit=self.tmp / "audit.jsonl", store=store,
                         sandbox="process", timeout=60)

    def suspend(self, task: str = "Send carol her invoice", principal: str = "alice") -> str:
        """Start a run until it suspends on its `send`; return the pending approval's id."""
        store = RunStore.open(self.store_url)
        try:
            with self.agent(store) as agent:
                result = agent.run(task, principal=principal, labels={"team": "billing"})
            assert result.status == "suspended", result.error
            return str(result.pending[0].id)
        finally:
            store.close()

    def resume(self, run_id: str) -> Any:
        store = RunStore.open(self.store_url)
        try:
            with self.agent(store, responses=["```python\nfinal_answer('again')\n```"]) as agent:
                return agent.resume(run_id)
        finally:
            store.close()


TWO_SENDS = ("x = send(to='ops@example.com', body='first')\n"
             "for n in [1]:\n"
             "    y = send(to='ceo@example.com', body='second')\n")


def file_positioned(store: RunStore, *, line: int = 3, col: int = 8, run_id: str = "run_pos0123456789") -> str:
    """A suspended run whose step calls `send` on two lines, and its approval for the call at (`line`, `col`)
    as `InboxApprover` files it when the worker reports the position. Returns the approval id."""
    import time

    from proctor.approval.base import ApprovalRequest, approval_binding
    from proctor.calls import CallPosition, RunInfo
    from proctor.errors import RunSuspended
    from proctor.store.base import RunRecord

    store.create_run(RunRecord(run_id=run_id, task="two sends", principal="alice", step=1, status="suspended",
                               step_state={"response": {"content": f"Thought: two.\n```python\n{TWO_SENDS}```"}}))
    args = {"to": "ceo@example.com", "body": "second"}
    call_id = f"call_{run_id}_1_1"
    request = ApprovalRequest(
        call_id=call_id, tool="send", side_effect="external", args=args, rules=("outbound",),
        reason="money leaves", policy_sha256="0" * 64, budget={"run-calls": {"calls": 48}},
        expires_at_ns=time.time_ns() + 600 * 10**9, binding=approval_binding("send", args, call_id, "0" * 64),
        run=RunInfo(id=run_id, step=1, principal="alice"), position=CallPosition(line, col),
        parameters=send.parameters)
    try:
        InboxApprover(store).request(request)
    except RunSuspended as suspended:
        return str(suspended.approval_id)
    raise AssertionError("the approval was answered at once")


#: A policy where mail inside the company goes out and mail outside waits for a human, and `send`
#: counts against a budget of two calls and 20 cost units (each send costs 5).
POSITION_POLICY = {
    "version": 1,
    "default": "deny",
    "tools": {"lookup": {"side_effect": "read"}, "send": {"side_effect": "external", "cost": 5}},
    "budgets": [{"name": "outbound", "match": {"tool": "send"}, "limit": {"calls": 2, "cost": 20}},
                {"name": "run-calls", "limit": {"calls": 50}}],
    "rules": [
        {"name": "reads", "match": {"side_effect": "read"}, "decision": "allow"},
        {"name": "internal-mail", "match": {"tool": "send"}, "when": "args.to.endsWith('@example.com')",
         "decision": "allow"},
        {"name": "outbound-mail", "match": {"tool": "send"}, "when": "!args.to.endsWith('@example.com')",
         "decision": "require_approval", "reason": "mail leaving the company needs a human"},
    ],
    "approval": POLICY["approval"],
}

#: One tool on two lines: the first call (allowed) runs, the second waits at line 3, column 8.
TWO_CALLS = ("x = send(to='ops@example.com', body='first')\n"
             "for n in [1]:\n"
             "    y = send(to='ceo@partner.org', body='second')\n"
             "final_answer(y)\n")

#: The same tool called through a helper the program defines: both calls are made at line 2, column 11.
THROUGH_A_HELPER = ("def notify(who):\n"
                    "    return send(to=who, body='hello')\n"
                    "notify('ops@example.com')\n"
                    "for who in ['ceo@partner.org']:\n"
                    "    notify(who)\n"
                    "final_answer('done')\n")


def suspend_program(inbox: Inbox, program: str, *, thought: str = "Thought: two.", principal: str = "alice",
                    policy: dict[str, Any] | None = None) -> str:
    """Run `program` as one step of a real durable run (a real worker, the real gate) under `policy`
    (default `POSITION_POLICY`) until it suspends; return the pending approval's id."""
    store = RunStore.open(inbox.store_url)
    try:
        agent = CodeAgent([lookup, send], ScriptedModel([f"{thought}\n```python\n{program}```"]),
                          Policy.from_dict(policy or POSITION_POLICY), approver=InboxApprover(store),
                          audit=inbox.tmp / "audit.jsonl", store=store, sandbox="process", timeout=60)
        with agent:
            result = agent.run("two sends", principal=principal)
        assert result.status == "suspended", result.error
        return str(result.pending[0].id)
    finally:
        store.close()


def background(fn: Any) -> tuple[threading.Thread, list[Any]]:
    """Run `fn` in a thread; its result (or exception) lands in the returned list."""
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, out


def iter_ok(items: list[Any]) -> Iterator[Any]:
    for item in items:
        if isinstance(item, BaseException):
            raise item
        yield item
