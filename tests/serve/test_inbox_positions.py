"""The pending call is marked where the program made it (the worker's report, checked by the host), never by
the tool's name, and the approver sees what the call takes from each budget: real runs, real workers."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from proctor.approval.tokens import TokenFile
from proctor.serve.app import create_app
from proctor.store.base import RunStore

from .inbox_helpers import SENT, THROUGH_A_HELPER, TWO_CALLS, Inbox, suspend_program


@pytest.fixture
def store(inbox: Inbox) -> Iterator[RunStore]:
    s = RunStore.open(inbox.store_url)
    yield s
    s.close()


def client(inbox: Inbox, store: RunStore) -> TestClient:
    c = TestClient(create_app(store, TokenFile.load(inbox.tokens_path), answers=inbox.answers), base_url="http://inbox.test")
    c.headers["Authorization"] = f"Bearer {inbox.tokens['bob']}"
    return c


def audit_records(inbox: Inbox, kind: str) -> list[dict[str, object]]:
    lines = (inbox.tmp / "audit.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_one_tool_on_two_lines_is_pending_at_the_second_only(inbox: Inbox, store: RunStore) -> None:
    """The issue's attack: `send` on line 1 (allowed, it ran) and line 3 (waiting). Only line 3 is marked, at
    the call's own columns, in the store, the API, the page, the audit log and `approvals show`."""
    approval_id = suspend_program(inbox, TWO_CALLS)
    assert SENT == [("ops@example.com", "first")]  # the first call ran; the second waits
    pending_line = TWO_CALLS.splitlines()[2]
    call = "send(to='ceo@partner.org', body='second')"
    approval = store.get_approval(approval_id)
    assert (approval.line, approval.col, approval.end_line, approval.end_col) == (3, 8, 3, len(pending_line))
    assert pending_line[approval.col:approval.end_col] == call

    c = client(inbox, store)
    view = c.get(f"/api/approvals/{approval_id}").json()
    assert view["position"] == {"line": 3, "col": 8, "end_line": 3, "end_col": len(pending_line)}
    marked = [line for line in view["program"] if line["marked"]]
    assert [m["number"] for m in marked] == [3]
    assert (marked[0]["before"], marked[0]["at"], marked[0]["after"]) == ("    y = ", call, "")
    assert [(e["tool"], e["status"], e["decision"]) for e in view["calls"]] == [("send", "ok", "allow")]

    c.post("/login", data={"token": inbox.tokens["bob"]})
    page = c.get(f"/approvals/{approval_id}").text
    assert page.count('class="line marked"') == 1 and page.count('id="pending-call"') == 1
    assert '<span class="at" id="pending-call">send(to=&#x27;ceo@partner.org&#x27;' in page
    assert "line 3, column 9" in page

    # The trail names the same place, and the journal's suspended entry is the same call at the same seq.
    requested = audit_records(inbox, "approval_requested")
    assert [r["position"] for r in requested] == [view["position"]]
    suspended = [e for e in store.journal(approval.run_id, approval.step) if e.state == "suspended"]
    assert [(e.call_id, e.seq) for e in suspended] == [(approval.call_id, approval.seq)] and approval.seq == 1

    shown = subprocess.run([sys.executable, "-m", "proctor.cli", "approvals", "show", approval_id, "--store",
                            inbox.store_url], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "step 1, call 2, line 3 column 9" in shown.stdout


def test_a_call_made_in_a_helper_is_marked_where_the_helper_makes_it(inbox: Inbox, store: RunStore) -> None:
    """Called through a helper from a loop: the position is the call in the program's text (the helper's
    body), the same line for the allowed call and the pending one; the loop's line is not marked."""
    approval_id = suspend_program(inbox, THROUGH_A_HELPER)
    approval = store.get_approval(approval_id)
    assert (approval.line, approval.col) == (2, 11)
    view = client(inbox, store).get(f"/api/approvals/{approval_id}").json()
    marked = [line for line in view["program"] if line["marked"]]
    assert [m["number"] for m in marked] == [2] and marked[0]["at"] == "send(to=who, body='hello')"
    assert view["approval"]["args"] == {"to": "ceo@partner.org", "body": "hello"}


def test_the_approver_sees_what_the_call_takes_from_each_budget(inbox: Inbox, store: RunStore) -> None:
    """`outbound` (2 calls, cost 20; a send costs 5): the first send used 1 call and 5; this one takes the last
    call and 5 more. The page, the API and `approvals show` say so, before and after."""
    approval_id = suspend_program(inbox, TWO_CALLS)
    approval = store.get_approval(approval_id)
    assert approval.spend == {"outbound": {"calls": 1, "cost": 5}, "run-calls": {"calls": 1}}
    assert approval.budget == {"outbound": {"calls": 0, "cost": 10}, "run-calls": {"calls": 48}}
    c = client(inbox, store)
    rows = {r["budget"]: r for r in c.get(f"/api/approvals/{approval_id}").json()["budgets"]}
    assert rows["outbound"]["text"] == "calls: takes 1 of 1 left → 0; cost: takes 5 of 15 left → 10"
    assert rows["run-calls"]["text"] == "calls: takes 1 of 49 left → 48"
    assert audit_records(inbox, "approval_requested")[0]["spend"] == approval.spend

    c.post("/login", data={"token": inbox.tokens["bob"]})
    page = c.get(f"/approvals/{approval_id}").text
    assert "calls: takes 1 of 1 left → 0; cost: takes 5 of 15 left → 10" in page

    shown = subprocess.run([sys.executable, "-m", "proctor.cli", "approvals", "show", approval_id, "--store",
                            inbox.store_url], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "outbound: calls: takes 1 of 1 left → 0; cost: takes 5 of 15 left → 10" in shown.stdout
    listed = json.loads(subprocess.run([sys.executable, "-m", "proctor.cli", "approvals", "list", "--json",
                                        "--store", inbox.store_url], capture_output=True, text=True,
                                       timeout=120).stdout)
    assert listed[0]["spend"] == approval.spend and listed[0]["line"] == 3
