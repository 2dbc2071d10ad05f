"""Approvers see what they decide: clear values but for fields hidden from approvers, look-alike, bidi and
invisible characters marked (page, API display fields, `proctor approvals show`), the pending call marked at
its reported position only, and the deadline."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from proctor import CodeAgent, InboxApprover, Policy, ScriptedModel
from proctor.approval.tokens import TokenFile
from proctor.serve.app import create_app
from proctor.store.base import RunStore

from .inbox_helpers import Inbox, file_positioned, lookup, send

SPOOF = "web-7f9\u0441"  # a Cyrillic es at the end
RLO = "rm -rf /srv/\u202eatad"  # a right-to-left override reverses what follows

WIRE_POLICY = {
    "version": 1,
    "default": "deny",
    "tools": {"lookup": {"side_effect": "read"},
              "send": {"side_effect": "external", "redact": ["to", "body"], "hide_from_approvers": ["body"]}},
    "rules": [{"name": "reads", "match": {"side_effect": "read"}, "decision": "allow"},
              {"name": "outbound", "match": {"tool": "send"}, "decision": "require_approval",
               "reason": "money leaves"}],
    "approval": {"timeout": "20m"},
}


@pytest.fixture
def store(inbox: Inbox) -> Iterator[RunStore]:
    s = RunStore.open(inbox.store_url)
    yield s
    s.close()


def suspend(inbox: Inbox, store: RunStore, program: str, policy: dict[str, object] = WIRE_POLICY) -> str:
    agent = CodeAgent([lookup, send], ScriptedModel([program]), Policy.from_dict(policy),
                      approver=InboxApprover(store), audit=inbox.tmp / "audit.jsonl", store=store, sandbox="process",
                      timeout=60)
    with agent:
        result = agent.run("Pay the invoice", principal="alice")
    assert result.status == "suspended", result.error
    return str(result.pending[0].id)


def bob(inbox: Inbox) -> dict[str, str]:
    return {"Authorization": f"Bearer {inbox.tokens['bob']}"}


def test_redacted_values_are_clear_to_approvers_unless_hidden_from_them(inbox: Inbox, store: RunStore) -> None:
    """`to` is redacted (the audit log and lists hold a digest) but shown in clear to an authenticated
    approver; `body` is hidden from approvers too, and the page says so and why."""
    # (The hidden value is computed, not written out: a program is shown as the model wrote it.)
    program = ("Thought: pay it.\n```python\nsend(to='DE89 3704 0044 0532 0130 00', body='PIN ' + str(4700 + 11))\n"
               "final_answer('ok')\n```")
    approval_id = suspend(inbox, store, program)
    stored = store.get_approval(approval_id)
    assert set(stored.args["to"]) == {"$redacted"}  # the redacted form stays what lists and logs carry
    c = TestClient(create_app(store, TokenFile.load(inbox.tokens_path), answers=inbox.answers), base_url="http://inbox.test")
    view = c.get(f"/api/approvals/{approval_id}", headers=bob(inbox)).json()
    assert view["shown_args"]["to"] == "DE89 3704 0044 0532 0130 00"
    assert set(view["shown_args"]["body"]) == {"$redacted"} and view["hidden"] == ["body"]
    assert "PIN 4711" not in json.dumps(view)
    listed = c.get("/api/approvals", headers=bob(inbox)).json()[0]
    assert set(listed["args"]["to"]) == {"$redacted"}
    c.post("/login", data={"token": inbox.tokens["bob"]})
    page = c.get(f"/approvals/{approval_id}").text
    assert "DE89 3704 0044 0532 0130 00" in page and "PIN 4711" not in page
    assert 'id="hidden-note"' in page and "hide_from_approvers" in page and "<code>body</code>" in page
    assert 'id="deadline"' in page and view["approval"]["expires_at"] in page  # the policy's 20m deadline
    # An edit shown with the clear value keeps working: the hidden field, sent back as shown, keeps its value.
    csrf = page.split('name="csrf" value="')[1].split('"')[0]
    edited = {**view["shown_args"], "to": "DE02 1203 0000 0000 2020 51"}
    r = c.post(f"/approvals/{approval_id}", data={"decision": "edit", "binding": stored.binding, "csrf": csrf,
                                                  "args": json.dumps(edited), "confirm": "send"},
               follow_redirects=False)
    assert r.status_code == 303, r.text
    answered = store.get_approval(approval_id)
    assert answered.answer is not None and answered.answer.args == edited


def test_look_alikes_and_bidi_are_marked_on_the_page_in_the_api_and_in_approvals_show(
        inbox: Inbox, store: RunStore) -> None:
    program = (f"Thought: clean {SPOOF}.\n```python\nsend(to={SPOOF!r}, body={RLO!r})\nfinal_answer('ok')\n```")
    policy = {**WIRE_POLICY, "tools": {"lookup": {"side_effect": "read"}, "send": {"side_effect": "external"}}}
    approval_id = suspend(inbox, store, program, policy)
    c = TestClient(create_app(store, TokenFile.load(inbox.tokens_path), answers=inbox.answers), base_url="http://inbox.test")
    view = c.get(f"/api/approvals/{approval_id}", headers=bob(inbox)).json()
    assert view["display"]["args"]["to"] == '"web-7f9\u0441\u27e8U+0441\u27e9"'
    assert "\\u202e" in view["display"]["args"]["body"] and "\u202e" not in view["display"]["args"]["body"]
    c.post("/login", data={"token": inbox.tokens["bob"]})
    page = c.get(f"/approvals/{approval_id}").text
    assert '<mark class="confusable" title="U+0441 CYRILLIC SMALL LETTER ES">' in page
    assert '<mark class="invisible" title="U+202E RIGHT-TO-LEFT OVERRIDE">\\u202e</mark>' in page
    assert "\u202e" not in page  # not in the arguments, the program, the thought: nowhere raw
    listing = c.get("/").text
    assert '<mark class="confusable"' in listing and "\u202e" not in listing
    shown = subprocess.run([sys.executable, "-m", "proctor.cli", "approvals", "show", approval_id, "--store",
                            inbox.store_url], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "web-7f9\u0441\u27e8U+0441\u27e9" in shown.stdout and "\\u202e" in shown.stdout
    assert "\u202e" not in shown.stdout


def test_the_pending_call_is_marked_at_its_reported_position_only(inbox: Inbox, store: RunStore) -> None:
    """One tool on two lines: only the line and column the worker reported are marked (never by name)."""
    approval_id = file_positioned(store, line=3, col=8)
    c = TestClient(create_app(store, TokenFile.load(inbox.tokens_path), answers=inbox.answers), base_url="http://inbox.test")
    view = c.get(f"/api/approvals/{approval_id}", headers=bob(inbox)).json()
    assert view["position"] == {"line": 3, "col": 8, "end_line": None, "end_col": None}
    marked = [line for line in view["program"] if line["marked"]]
    assert [m["number"] for m in marked] == [3] and marked[0]["at"].startswith("send(to='ceo@")
    c.post("/login", data={"token": inbox.tokens["bob"]})
    page = c.get(f"/approvals/{approval_id}").text
    assert page.count('class="line marked"') == 1 and "line 3, column 9" in page
    assert '<span class="at" id="pending-call">send(to=&#x27;ceo@example.com&#x27;' in page


def test_after_an_answer_the_page_says_what_happens_next(inbox: Inbox, store: RunStore) -> None:
    approval_id = inbox.suspend()
    c = TestClient(create_app(store, TokenFile.load(inbox.tokens_path), answers=inbox.answers), base_url="http://inbox.test")
    binding = store.get_approval(approval_id).binding
    assert c.post(f"/api/approvals/{approval_id}", headers=bob(inbox),
                  json={"decision": "approve", "binding": binding, "reason": "checked the PO"}).status_code == 200
    view = c.get(f"/api/approvals/{approval_id}", headers=bob(inbox)).json()
    run_id = view["approval"]["run_id"]
    assert f"proctor runs resume {run_id}" in view["next"] and "serve --resume" in view["next"]
    assert view["approval"]["answer"]["reason"] == "checked the PO"
    resuming = TestClient(create_app(store, TokenFile.load(inbox.tokens_path), answers=inbox.answers, resumes=True),
                          base_url="http://inbox.test")
    again = resuming.get(f"/api/approvals/{approval_id}", headers=bob(inbox)).json()
    assert "resumed by this inbox" in again["next"]
    inbox.resume(run_id)
    done = c.get(f"/api/approvals/{approval_id}", headers=bob(inbox)).json()
    assert done["next"] == f"Run {run_id} has ended: done."
    page_client = TestClient(create_app(store, TokenFile.load(inbox.tokens_path), answers=inbox.answers), base_url="http://inbox.test")
    page_client.post("/login", data={"token": inbox.tokens["bob"]})
    timeline = page_client.get(f"/runs/{run_id}").text
    assert 'id="approvals"' in timeline and "approve by bob" in timeline and "checked the PO" in timeline
    assert run_id in timeline and view["approval"]["requested_at"] in timeline

