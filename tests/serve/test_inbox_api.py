"""The inbox's JSON API and its security, over a real run suspended in a real store."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from proctor.approval.tokens import TokenFile
from proctor.audit import verify
from proctor.serve.app import create_app
from proctor.store.base import RunStore

from .inbox_helpers import SENT, Inbox, background


@pytest.fixture
def client(inbox: Inbox) -> Iterator[TestClient]:
    store = RunStore.open(inbox.store_url)
    with TestClient(create_app(store, TokenFile.load(inbox.tokens_path), answers=inbox.answers),
                    base_url="http://inbox.test") as c:
        yield c
    store.close()


def bearer(inbox: Inbox, name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {inbox.tokens[name]}"}


def test_token_file_holds_only_hashes(inbox: Inbox) -> None:
    """The token file stores each approver's hash, never the token, and is private to its owner."""
    text = inbox.tokens_path.read_text()
    assert inbox.tokens["bob"] not in text and "bob sha256:" in text
    assert inbox.tokens_path.stat().st_mode & 0o077 == 0


def test_api_needs_credentials(inbox: Inbox, client: TestClient) -> None:
    """Without a valid token the API answers 401, and pages send the browser to the login form."""
    assert client.get("/api/approvals").status_code == 401
    assert client.get("/api/approvals", headers={"Authorization": "Bearer nope"}).status_code == 401
    page = client.get("/", follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"].startswith("/login")


def test_list_and_show_a_pending_call(inbox: Inbox, client: TestClient) -> None:
    """The list carries the contract's fields; one approval carries the run, its program and earlier calls."""
    approval_id = inbox.suspend()
    items = client.get("/api/approvals", headers=bearer(inbox, "bob")).json()
    assert [a["id"] for a in items] == [approval_id]
    item = items[0]
    assert {"id", "run_id", "tool", "args", "binding", "principal", "rules", "reason", "requested_at"} <= set(item)
    assert item["tool"] == "send" and item["principal"] == "alice" and item["rules"] == ["outbound-mail"]
    one = client.get(f"/api/approvals/{approval_id}", headers=bearer(inbox, "bob")).json()
    assert one["run"]["task"] == "Send carol her invoice"
    # The call is marked where the worker reported it (line 2 of the program, from column 4 to its end).
    line = "r = send(to='carol@partner.org', body='your invoice')"
    assert one["position"] == {"line": 2, "col": 4, "end_line": 2, "end_col": len(line)}
    marked = [entry for entry in one["program"] if entry["marked"]]
    assert [m["number"] for m in marked] == [2] and marked[0]["at"] == line[4:] and marked[0]["before"] == "r = "
    assert [(c["tool"], c["status"]) for c in one["calls"]] == [("lookup", "ok")]
    assert one["calls"][0]["result"] == "carol <carol@partner.org>"  # a preview of the earlier call's result
    assert one["thought"] == "Thought: find the address, then write."


def test_filters(inbox: Inbox, client: TestClient) -> None:
    """Pending approvals filter by tool, principal and run label."""
    inbox.suspend()
    h = bearer(inbox, "bob")
    assert len(client.get("/api/approvals?tool=send", headers=h).json()) == 1
    assert client.get("/api/approvals?tool=lookup", headers=h).json() == []
    assert client.get("/api/approvals?principal=zed", headers=h).json() == []
    assert len(client.get("/api/approvals?label=team=billing", headers=h).json()) == 1
    assert client.get("/api/approvals?label=team=ops", headers=h).json() == []


def test_four_eyes(inbox: Inbox, client: TestClient) -> None:
    """The run's principal cannot answer its own call: 403, and the call stays pending."""
    approval_id = inbox.suspend(principal="alice")
    binding = client.get(f"/api/approvals/{approval_id}", headers=bearer(inbox, "alice")).json()["approval"]["binding"]
    r = client.post(f"/api/approvals/{approval_id}", headers=bearer(inbox, "alice"),
                    json={"decision": "approve", "binding": binding})
    assert r.status_code == 403 and "four eyes" in r.json()["error"]
    assert client.get(f"/api/approvals/{approval_id}", headers=bearer(inbox, "bob")).json()["approval"]["status"] \
        == "pending"


def test_stale_binding_is_a_conflict(inbox: Inbox, client: TestClient) -> None:
    """An answer echoing another binding (a stale page) is refused with 409 and changes nothing."""
    approval_id = inbox.suspend()
    r = client.post(f"/api/approvals/{approval_id}", headers=bearer(inbox, "bob"),
                    json={"decision": "approve", "binding": "0" * 64})
    assert r.status_code == 409
    assert client.get(f"/api/approvals/{approval_id}", headers=bearer(inbox, "bob")).json()["approval"]["status"] \
        == "pending"


def test_approve_then_resume_runs_the_call_once_and_audits_who(inbox: Inbox, client: TestClient) -> None:
    """An approval through the API lets the resumed run send exactly once; the log names bob and his address."""
    approval_id = inbox.suspend()
    binding = client.get(f"/api/approvals/{approval_id}", headers=bearer(inbox, "bob")).json()["approval"]["binding"]
    r = client.post(f"/api/approvals/{approval_id}", headers=bearer(inbox, "bob"),
                    json={"decision": "approve", "binding": binding, "reason": "checked the invoice"})
    assert r.status_code == 200 and r.json()["status"] == "answered"
    again = client.post(f"/api/approvals/{approval_id}", headers=bearer(inbox, "bob"),
                        json={"decision": "approve", "binding": binding})
    assert again.status_code == 409  # answered once only
    assert SENT == []
    result = inbox.resume(r.json()["run_id"])
    assert result.status == "done" and SENT == [("carol@partner.org", "your invoice")]
    records = [json.loads(line) for line in (inbox.tmp / "audit.jsonl").read_text().splitlines()]
    resolved = [r for r in records if r["kind"] == "approval_resolved" and r.get("verdict") == "approve"]
    assert resolved and (resolved[-1]["approver"], resolved[-1]["address"]) == ("bob", "testclient")
    assert verify(inbox.tmp / "audit.jsonl").ok


def test_deny_needs_a_reason_and_reaches_the_program(inbox: Inbox, client: TestClient) -> None:
    """A deny without a reason is 422; with one, the resumed program sees the refusal and nothing is sent."""
    approval_id = inbox.suspend()
    h = bearer(inbox, "bob")
    binding = client.get(f"/api/approvals/{approval_id}", headers=h).json()["approval"]["binding"]
    assert client.post(f"/api/approvals/{approval_id}", headers=h,
                       json={"decision": "deny", "binding": binding}).status_code == 422
    r = client.post(f"/api/approvals/{approval_id}", headers=h,
                    json={"decision": "deny", "binding": binding, "reason": "wrong customer"})
    assert r.status_code == 200
    result = inbox.resume(r.json()["run_id"])
    assert SENT == []
    seen = " ".join(f"{s.observation} {s.error}" for s in result.steps)
    assert "approval denied by bob" in seen and "wrong customer" in seen


def test_edit_is_validated_against_the_tools_schema(inbox: Inbox, client: TestClient) -> None:
    """Edited arguments the tool would refuse are 422 before they are stored; valid ones run instead."""
    approval_id = inbox.suspend()
    h = bearer(inbox, "bob")
    binding = client.get(f"/api/approvals/{approval_id}", headers=h).json()["approval"]["binding"]
    bad = client.post(f"/api/approvals/{approval_id}", headers=h,
                      json={"decision": "edit", "binding": binding, "args": {"to": 42, "body": "x"}})
    assert bad.status_code == 422 and "to" in bad.json()["error"]
    ok = client.post(f"/api/approvals/{approval_id}", headers=h,
                     json={"decision": "edit", "binding": binding,
                           "args": {"to": "billing@partner.org", "body": "your invoice"}})
    assert ok.status_code == 200
    inbox.resume(ok.json()["run_id"])
    assert SENT == [("billing@partner.org", "your invoice")]


def test_session_login_cookie_and_csrf(inbox: Inbox, client: TestClient) -> None:
    """Login sets an HttpOnly SameSite cookie; a form post without its CSRF token or from another origin is 403."""
    approval_id = inbox.suspend()
    r = client.post("/login", data={"token": inbox.tokens["bob"], "next": "/"}, follow_redirects=False)
    assert r.status_code == 303
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    page = client.get(f"/approvals/{approval_id}")
    assert page.status_code == 200 and "your invoice" in page.text
    binding = client.get(f"/api/approvals/{approval_id}").json()["approval"]["binding"]
    no_csrf = client.post(f"/approvals/{approval_id}", data={"decision": "approve", "binding": binding},
                          follow_redirects=False)
    assert no_csrf.status_code == 403
    api_no_csrf = client.post(f"/api/approvals/{approval_id}", json={"decision": "approve", "binding": binding})
    assert api_no_csrf.status_code == 403
    csrf = page.text.split('name="csrf" value="')[1].split('"')[0]
    cross = client.post(f"/approvals/{approval_id}", data={"decision": "approve", "binding": binding, "csrf": csrf},
                        headers={"Origin": "https://evil.example"}, follow_redirects=False)
    assert cross.status_code == 403
    ok = client.post(f"/approvals/{approval_id}", data={"decision": "approve", "binding": binding, "csrf": csrf,
                                                        "confirm": "send"}, follow_redirects=False)
    assert ok.status_code == 303
    assert client.get(f"/api/approvals/{approval_id}").json()["approval"]["status"] == "answered"


def test_bad_login_and_open_redirect(inbox: Inbox, client: TestClient) -> None:
    """A wrong token is refused, and the login never redirects off the site."""
    assert client.post("/login", data={"token": "wrong"}, follow_redirects=False).status_code == 401
    r = client.post("/login", data={"token": inbox.tokens["bob"], "next": "//evil.example/x"}, follow_redirects=False)
    assert r.headers["location"] == "/"


def test_proxy_header_only_when_enabled(inbox: Inbox) -> None:
    """A user header counts only when the server was told to trust a proxy."""
    store = RunStore.open(inbox.store_url)
    try:
        plain = TestClient(create_app(store, TokenFile.load(inbox.tokens_path), answers=inbox.answers))
        assert plain.get("/api/approvals", headers={"X-Forwarded-User": "bob"}).status_code == 401
        proxied = TestClient(create_app(store, TokenFile.load(inbox.tokens_path), answers=inbox.answers,
                                        proxy_header="X-Forwarded-User"))
        assert proxied.get("/api/approvals", headers={"X-Forwarded-User": "bob"}).status_code == 200
    finally:
        store.close()


def test_waiting_run_wakes_on_an_answer(inbox: Inbox, client: TestClient) -> None:
    """A run waiting in-process (InboxApprover with wait) goes on within about a second of the answer."""
    import time

    store = RunStore.open(inbox.store_url)
    try:
        agent = inbox.agent(store, wait="60s")
        thread, out = background(lambda: agent.run("Send carol her invoice", principal="alice"))
        deadline = time.monotonic() + 60
        items: list[dict[str, object]] = []
        while not items and time.monotonic() < deadline:
            items = client.get("/api/approvals", headers=bearer(inbox, "bob")).json()
            time.sleep(0.05)
        assert items, "the run never filed its approval"
        answered = time.monotonic()
        client.post(f"/api/approvals/{items[0]['id']}", headers=bearer(inbox, "bob"),
                    json={"decision": "approve", "binding": items[0]["binding"]})
        thread.join(timeout=60)
        assert out and not isinstance(out[0], BaseException) and out[0].status == "done"
        assert SENT == [("carol@partner.org", "your invoice")]
        assert time.monotonic() - answered < 30  # generous for a loaded machine; the poll itself is sub-second
        agent.close()
    finally:
        store.close()


def test_grants_are_previewed_and_checked(inbox: Inbox, client: TestClient) -> None:
    """The preview says what a grant admits (this call included); unsafe patterns and unknown arguments are 422."""
    approval_id = inbox.suspend()
    h = bearer(inbox, "bob")
    preview = client.get(f"/api/approvals/{approval_id}/grant-preview", headers=h,
                         params={"patterns": json.dumps({"to": "*@partner.org"})}).json()["admits"]
    assert any("to=" in line and "admitted" in line for line in preview)
    binding = client.get(f"/api/approvals/{approval_id}", headers=h).json()["approval"]["binding"]
    for bad in ({"to": "[a-z]*@partner.org"}, {"to": "* @partner.org"}, {"recipient": "*@partner.org"}):
        r = client.post(f"/api/approvals/{approval_id}", headers=h,
                        json={"decision": "grant", "binding": binding, "grant": {"args": bad}})
        assert r.status_code == 422, bad
    ok = client.post(f"/api/approvals/{approval_id}", headers=h,
                     json={"decision": "grant", "binding": binding, "grant": {"args": {"to": "*@partner.org"}}})
    assert ok.status_code == 200 and ok.json()["answer"]["grant"] == {"tool": "send",
                                                                     "args": {"to": "*@partner.org"}}


def test_hostile_json_is_a_422_not_a_crash(inbox: Inbox, client: TestClient) -> None:
    """Deeply nested or malformed JSON in the API body, a form field or the grant preview is refused with 422."""
    approval_id = inbox.suspend()
    h = bearer(inbox, "bob")
    deep = "[" * 50_000 + "]" * 50_000
    assert client.post(f"/api/approvals/{approval_id}", headers={**h, "Content-Type": "application/json"},
                       content=deep).status_code == 422
    assert client.post(f"/api/approvals/{approval_id}", headers=h, json={"decision": "approve"}).status_code == 422
    assert client.get(f"/api/approvals/{approval_id}/grant-preview", headers=h,
                      params={"patterns": "[" * 2_000 + "]" * 2_000}).status_code == 422
    client.post("/login", data={"token": inbox.tokens["bob"]})
    page = client.get(f"/approvals/{approval_id}")
    csrf = page.text.split('name="csrf" value="')[1].split('"')[0]
    binding = client.get(f"/api/approvals/{approval_id}").json()["approval"]["binding"]
    r = client.post(f"/approvals/{approval_id}", data={"decision": "edit", "binding": binding, "csrf": csrf,
                                                       "args": deep}, follow_redirects=False)
    assert r.status_code == 422 and "edited arguments" in r.text
    assert client.get(f"/api/approvals/{approval_id}").json()["approval"]["status"] == "pending"

