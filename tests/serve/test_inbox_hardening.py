"""The inbox as a hardened web app, attacked over raw HTTP: headers on every response, bodies bounded
before anything parses them (a held-open 48 MB body, chunked or declared, against a real `proctor serve`
process whose memory is measured), body types, confirmations, token rotation and proxy addresses."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from proctor.approval.tokens import TokenFile, add_token
from proctor.serve.app import create_app
from proctor.serve.guard import CSP, LOGIN_MAX_BODY
from proctor.store.base import RunStore

from .browser import free_port
from .inbox_helpers import Inbox

pytestmark = [pytest.mark.timeout(300), pytest.mark.server]

FORTY_EIGHT_MB = 48 << 20


@pytest.fixture
def store(inbox: Inbox) -> Iterator[RunStore]:
    s = RunStore.open(inbox.store_url)
    yield s
    s.close()


def client_for(inbox: Inbox, store: RunStore, **kwargs: object) -> TestClient:
    return TestClient(create_app(store, TokenFile.load(inbox.tokens_path), answers=inbox.answers, **kwargs),  # type: ignore[arg-type]
                      base_url="http://inbox.test")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def log_in(client: TestClient, token: str) -> str:
    """Log in with `token`; return the session's CSRF token (from a page)."""
    r = client.post("/login", data={"token": token}, follow_redirects=False)
    assert r.status_code == 303, r.text
    page = client.get("/")
    assert page.status_code == 200
    return page.text.split('name="csrf" value="')[1].split('"')[0]


def assert_hardened(response: object) -> None:
    headers = response.headers  # type: ignore[attr-defined]
    assert headers["content-security-policy"] == CSP
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY"
    assert headers["x-content-type-options"] == "nosniff"


def test_every_response_forbids_framing_and_foreign_script(inbox: Inbox, store: RunStore) -> None:
    """Pages, the login form, static files, the API, 401s, 404s, 413s and 415s all carry the headers."""
    approval_id = inbox.suspend()
    c = client_for(inbox, store)
    responses = [c.get("/login"), c.get("/static/inbox.css"), c.get("/static/inbox.js"), c.get("/api/approvals"),
                 c.get("/", follow_redirects=False), c.get("/nowhere"),
                 c.post("/login", content=b"x" * (LOGIN_MAX_BODY + 1),
                        headers={"Content-Type": "application/x-www-form-urlencoded"}),
                 c.post("/login", files={"token": ("t", b"x")})]
    log_in(c, inbox.tokens["bob"])
    responses += [c.get("/"), c.get(f"/approvals/{approval_id}"), c.get("/runs"), c.get("/approvals/apr_nope")]
    for r in responses:
        assert_hardened(r)
    # No script but the inbox's own, on any page; no interactive API docs, no schema unless asked for.
    for r in responses:
        if r.headers.get("content-type", "").startswith("text/html"):
            assert re.findall(r"<script[^>]*>", r.text) in ([], ['<script src="/static/inbox.js" defer>']), r.text
            assert "javascript:" not in r.text
    for path in ("/api/docs", "/docs", "/redoc", "/api/openapi.json", "/openapi.json"):
        assert c.get(path).status_code == 404, path


def test_openapi_schema_only_when_asked_and_only_to_approvers(inbox: Inbox, store: RunStore) -> None:
    c = client_for(inbox, store, openapi=True)
    assert c.get("/api/openapi.json").status_code == 401
    schema = c.get("/api/openapi.json", headers=bearer(inbox.tokens["bob"])).json()
    assert "/api/approvals/{approval_id}" in schema["paths"]
    assert c.get("/api/docs").status_code == 404


def test_body_types_are_refused_where_not_taken(inbox: Inbox, store: RunStore) -> None:
    """Multipart nowhere, JSON only under /api/, forms elsewhere: 415 before any route reads the body."""
    approval_id = inbox.suspend()
    c = client_for(inbox, store)
    csrf = log_in(c, inbox.tokens["bob"])
    binding = c.get(f"/api/approvals/{approval_id}").json()["approval"]["binding"]
    multipart = c.post(f"/approvals/{approval_id}", data={"decision": "approve", "binding": binding, "csrf": csrf,
                                                          "confirm": "send"}, files={"f": ("a.txt", b"x" * 1000)})
    assert multipart.status_code == 415 and "multipart" in multipart.json()["error"]
    as_text = c.post(f"/api/approvals/{approval_id}", content=b'{"decision": "approve"}',
                     headers={"Content-Type": "text/plain", "X-CSRF-Token": csrf})
    assert as_text.status_code == 415
    json_form = c.post(f"/approvals/{approval_id}", json={"decision": "approve", "binding": binding, "csrf": csrf})
    assert json_form.status_code == 415
    assert c.post("/login", files={"token": ("t", inbox.tokens["bob"].encode())}).status_code == 415
    assert store.get_approval(approval_id).status == "pending"


def test_a_body_over_the_limit_is_413_on_every_route(inbox: Inbox, store: RunStore) -> None:
    approval_id = inbox.suspend()
    c = client_for(inbox, store, max_body=64 << 10)
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    big = b"reason=" + b"x" * (64 << 10)
    assert c.post("/login", content=b"token=" + b"x" * LOGIN_MAX_BODY, headers=form).status_code == 413
    assert c.post("/logout", content=b"csrf=" + b"x" * LOGIN_MAX_BODY, headers=form).status_code == 413
    assert c.post(f"/approvals/{approval_id}", content=big, headers=form).status_code == 413
    h = {**bearer(inbox.tokens["bob"]), "Content-Type": "application/json"}
    assert c.post(f"/api/approvals/{approval_id}", content=b'{"reason": "' + b"x" * (64 << 10) + b'"}',
                  headers=h).status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams
        yield b"token="
        for _ in range(64):
            yield b"x" * 1024

    assert c.post("/login", content=chunks(), headers=form).status_code == 413
    assert store.get_approval(approval_id).status == "pending"


def test_credentials_are_checked_before_the_body_is_read(inbox: Inbox, store: RunStore) -> None:
    """An approval post without a session is sent to the login form, its body unread (it may be huge)."""
    approval_id = inbox.suspend()
    c = client_for(inbox, store)
    r = c.post(f"/approvals/{approval_id}", content=b"decision=approve&binding=x",
               headers={"Content-Type": "application/x-www-form-urlencoded"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/login")
    assert c.post(f"/api/approvals/{approval_id}", json={"decision": "approve"}).status_code == 401
    assert c.post("/logout", data={"csrf": "x"}, follow_redirects=False).status_code == 303


# -- a real server process, raw sockets, and its memory -----------------------------------------------------


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture
def served(inbox: Inbox) -> Iterator[tuple[int, int]]:
    """`proctor serve` in its own process; yields (port, pid)."""
    inbox.suspend()
    port = free_port()
    log = inbox.tmp / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "proctor.cli", "serve", "--store", inbox.store_url,
                                 "--tokens", str(inbox.tokens_path), "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError(f"proctor serve did not start: {log.read_text()}") from None
                time.sleep(0.1)
        yield port, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _status_of(sock: socket.socket) -> int:
    sock.settimeout(30)
    head = b""
    while b"\r\n" not in head:
        part = sock.recv(4096)
        if not part:
            break
        head += part
    return int(head.split(b" ", 2)[1])


def _held_open(port: int, path: str, headers: str, pid: int) -> tuple[int, int, int]:
    """Send the head and then body bytes until the server answers; (status, bytes sent, RSS growth KiB)."""
    before = _rss_kib(pid)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}\r\n".encode())
        sent, chunk, status = 0, b"a" * 65536, 0
        sock.settimeout(0.05)
        while sent < FORTY_EIGHT_MB:
            try:
                sock.sendall(chunk if "chunked" not in headers else b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
            try:
                if sock.recv(1, socket.MSG_PEEK):
                    break
            except (TimeoutError, BlockingIOError):
                continue
        status = _status_of(sock)
    return status, sent, _rss_kib(pid) - before


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_a_held_open_48_mb_body_is_refused_before_it_is_buffered(served: tuple[int, int], declared: bool) -> None:
    """Unauthenticated /login with a 48 MB urlencoded body, declared or chunked: 413 before the server has
    taken more than the limit, and the server's memory does not grow by the body."""
    port, pid = served
    kind = "Content-Type: application/x-www-form-urlencoded\r\n"
    headers = kind + (f"Content-Length: {FORTY_EIGHT_MB}\r\n" if declared else "Transfer-Encoding: chunked\r\n")
    status, sent, grown_kib = _held_open(port, "/login", headers, pid)
    assert status == 413
    assert sent < 8 << 20, f"the server read {sent} bytes before refusing"
    assert grown_kib < 8 << 10, f"the server grew by {grown_kib} KiB"


def test_a_held_open_body_to_an_approval_post_is_refused_unread(served: tuple[int, int], inbox: Inbox) -> None:
    """The approval posts and the API: no credentials, no body read; with a token, still bounded."""
    port, pid = served
    store = RunStore.open(inbox.store_url)
    approval_id = store.list_approvals()[0].id
    store.close()
    form = "Content-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\n"
    status, sent, grown = _held_open(port, f"/approvals/{approval_id}", form, pid)
    assert status == 303 and sent < 8 << 20 and grown < 8 << 10
    api = (f"Content-Type: application/json\r\nAuthorization: Bearer {inbox.tokens['bob']}\r\n"
           "Transfer-Encoding: chunked\r\n")
    status, sent, grown = _held_open(port, f"/api/approvals/{approval_id}", api, pid)
    assert status == 413 and sent < 8 << 20 and grown < 8 << 10


# -- confirmations -------------------------------------------------------------------------------------


def test_an_external_call_needs_its_name_typed_in_a_browser(inbox: Inbox, store: RunStore) -> None:
    """A session's answer (form or API) to an external call without the typed tool name is refused; the
    same with the name goes through. A bearer-token client (the CLI) is not a page and needs none."""
    first = inbox.suspend()
    c = client_for(inbox, store)
    csrf = log_in(c, inbox.tokens["bob"])
    binding = store.get_approval(first).binding
    for confirm in ("", "a", "SEND", "sen"):
        r = c.post(f"/approvals/{first}", data={"decision": "approve", "binding": binding, "csrf": csrf,
                                                "confirm": confirm}, follow_redirects=False)
        assert r.status_code == 422 and "type its name" in r.text, confirm
        r = c.post(f"/api/approvals/{first}", json={"decision": "grant", "binding": binding, "grant": {"args": {}},
                                                    "confirm": confirm}, headers={"X-CSRF-Token": csrf})
        assert r.status_code == 422, confirm
    assert store.get_approval(first).status == "pending"
    deny = c.post(f"/approvals/{first}", data={"decision": "deny", "binding": binding, "csrf": csrf,
                                               "reason": "no"}, follow_redirects=False)
    assert deny.status_code == 303  # saying no needs no confirmation
    second = inbox.suspend(task="again")
    ok = c.post(f"/api/approvals/{second}", json={"decision": "approve", "binding": store.get_approval(second).binding,
                                                  "confirm": "send"}, headers={"X-CSRF-Token": csrf})
    assert ok.status_code == 200
    third = inbox.suspend(task="and again")
    plain = client_for(inbox, store)
    by_token = plain.post(f"/api/approvals/{third}", headers=bearer(inbox.tokens["bob"]),
                          json={"decision": "approve", "binding": store.get_approval(third).binding})
    assert by_token.status_code == 200


# -- tokens and sessions ---------------------------------------------------------------------------------


def test_a_replaced_or_removed_token_and_its_sessions_end_at_once(inbox: Inbox, store: RunStore) -> None:
    c = client_for(inbox, store)
    old = inbox.tokens["bob"]
    log_in(c, old)
    assert c.get("/api/approvals").status_code == 200  # the session
    assert c.get("/api/approvals", headers=bearer(old)).status_code == 200
    new = add_token(inbox.tokens_path, "bob")  # `proctor serve token bob`: the old token leaked
    assert c.get("/api/approvals", headers=bearer(old)).status_code == 401
    assert c.get("/api/approvals").status_code == 401  # the old token's session is over
    assert c.get("/", follow_redirects=False).headers["location"].startswith("/login")
    assert c.get("/api/approvals", headers=bearer(new)).status_code == 200
    log_in(c, new)
    assert c.get("/api/approvals").status_code == 200
    # Removing the line ends bob's sessions and token; alice is untouched.
    lines = [ln for ln in inbox.tokens_path.read_text().splitlines() if not ln.startswith("bob ")]
    inbox.tokens_path.write_text("\n".join(lines) + "\n")
    assert c.get("/api/approvals").status_code == 401
    assert c.get("/api/approvals", headers=bearer(new)).status_code == 401
    assert c.get("/api/approvals", headers=bearer(inbox.tokens["alice"])).status_code == 200
    # A token file that cannot be read admits nobody (fail closed), and recovers when fixed.
    good = inbox.tokens_path.read_text()
    inbox.tokens_path.write_text("this is not a token line\n")
    assert c.get("/api/approvals", headers=bearer(inbox.tokens["alice"])).status_code == 401
    inbox.tokens_path.write_text(good)
    assert c.get("/api/approvals", headers=bearer(inbox.tokens["alice"])).status_code == 200


# -- proxies ----------------------------------------------------------------------------------------------


def test_proxy_mode_takes_the_address_from_the_trusted_hop(inbox: Inbox, store: RunStore) -> None:
    """Behind N proxies the address is the N-th X-Forwarded-For entry from the right; what the client put
    first is never recorded."""
    a1, a2, a3 = inbox.suspend(), inbox.suspend(task="two"), inbox.suspend(task="three")
    spoof = {"X-Forwarded-For": "6.6.6.6, 10.1.2.3", "X-Forwarded-User": "bob"}
    one = client_for(inbox, store, proxy_header="X-Forwarded-User")
    r = one.post(f"/api/approvals/{a1}", headers=spoof,
                 json={"decision": "approve", "binding": store.get_approval(a1).binding})
    assert r.status_code == 200 and r.json()["answer"]["address"] == "10.1.2.3"
    two = client_for(inbox, store, proxy_header="X-Forwarded-User", trusted_proxies=2)
    r = two.post(f"/api/approvals/{a2}", headers={**spoof, "X-Forwarded-For": "6.6.6.6, 192.0.2.7, 10.1.2.3"},
                 json={"decision": "approve", "binding": store.get_approval(a2).binding})
    assert r.status_code == 200 and r.json()["answer"]["address"] == "192.0.2.7"
    # Fewer entries than trusted hops: the request did not come through them; the peer's address is kept.
    r = two.post(f"/api/approvals/{a3}", headers={**spoof, "X-Forwarded-For": "6.6.6.6"},
                 json={"decision": "approve", "binding": store.get_approval(a3).binding})
    assert r.status_code == 200 and r.json()["answer"]["address"] == "testclient"
