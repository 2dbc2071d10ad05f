"""A real durable run waiting for a human, and an inbox over its store, for the inbox tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proctor import CodeAgent, InboxApprover, Policy, RunStore, ScriptedModel, tool
from proctor.serve.tokens import add_token

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
