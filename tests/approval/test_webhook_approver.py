"""Tests for WebhookApprover against a real HTTP server on localhost."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from approval_helpers import make_request

from proctor.approval import ApprovalRequest, Approver, WebhookApprover
from proctor.approval.webhook import sign, signed_headers, verify

SECRET = "whsec_test_secret"


@dataclass
class Reply:
    """What the test server answers: status, raw body, headers (signed unless told), optional delay."""

    body: bytes
    status: int = 200
    headers: dict[str, str] | None = None
    delay: float = 0.0


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Hook:
    """A localhost approval service whose answers each test scripts."""

    server: ThreadingHTTPServer
    url: str
    respond: Callable[[Received], Reply] = lambda r: Reply(b"{}")
    received: list[Received] = field(default_factory=list)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def signed(answer: dict[str, Any], *, secret: str = SECRET, now: float | None = None, status: int = 200) -> Reply:
    """A reply carrying `answer` as JSON with a valid signature (for `secret`, timestamped `now`)."""
    body = json.dumps(answer).encode()
    return Reply(body, status, signed_headers(secret, body, now=now))


def answer_for(request: ApprovalRequest, status: str, **extra: Any) -> dict[str, Any]:
    return {"status": status, "call_id": request.call_id, "binding": request.binding, **extra}


@pytest.fixture
def hook() -> Iterator[Hook]:
    """Start a threaded HTTP server on a free localhost port; stop it afterwards."""
    holder: list[Hook] = []

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            got = Received(self.command, self.path, dict(self.headers.items()), self.rfile.read(length))
            current = holder[0]
            current.received.append(got)
            reply = current.respond(got)
            if reply.delay:
                time.sleep(reply.delay)
            try:
                self.send_response(reply.status)
                for name, value in (reply.headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)
            except OSError:
                pass  # the client gave up (slow-server test): nothing to answer

        do_POST = _serve
        do_GET = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.block_on_close = False
    holder.append(Hook(server, f"http://127.0.0.1:{server.server_address[1]}/approve"))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield holder[0]
    if thread.is_alive():
        holder[0].stop()
    thread.join(5)


def approver(hook: Hook, **kwargs: Any) -> WebhookApprover:
    options: dict[str, Any] = {"timeout": 5.0, "poll_interval": 0.05, "request_timeout": 1.0, **kwargs}
    return WebhookApprover(hook.url, secret=SECRET, **options)


def test_server_receives_a_correctly_signed_request(hook: Hook) -> None:
    """The POST body is the request plus version 1, signed with the shared secret and a fresh timestamp."""
    req = make_request()
    hook.respond = lambda r: signed(answer_for(req, "approved", approver="alice"))
    decision = approver(hook).request(req)
    assert decision.verdict == "approve"
    (got,) = hook.received
    assert got.method == "POST" and got.path == "/approve"
    assert got.headers["Content-Type"] == "application/json"
    assert abs(int(got.headers["X-Proctor-Timestamp"]) - time.time()) < 5
    verify(SECRET, got.headers["X-Proctor-Timestamp"], got.headers["X-Proctor-Signature"], got.body)
    assert json.loads(got.body) == {**req.as_dict(), "version": 1}


def test_immediate_approve_records_who(hook: Hook) -> None:
    """An approved answer approves this call, naming the webhook host and the answer's approver."""
    req = make_request()
    hook.respond = lambda r: signed(answer_for(req, "approved", approver="alice", reason="looks fine"))
    decision = approver(hook).request(req)
    host = hook.url.split("/")[2]
    assert (decision.verdict, decision.binding) == ("approve", req.binding)
    assert decision.approver == f"webhook:{host}/alice" and decision.reason == "looks fine"


def test_immediate_deny_keeps_the_reason(hook: Hook) -> None:
    """A denied answer denies with the service's reason."""
    req = make_request()
    hook.respond = lambda r: signed(answer_for(req, "denied", approver="bob", reason="not to partners"))
    decision = approver(hook).request(req)
    assert (decision.verdict, decision.reason, decision.timed_out) == ("deny", "not to partners", False)


def test_immediate_edit_carries_new_args(hook: Hook) -> None:
    """An edited answer becomes an edit with the new arguments."""
    req = make_request()
    new_args = {"to": "bob@partner.org", "subject": "hi", "body": "hello (reviewed)"}
    hook.respond = lambda r: signed(answer_for(req, "edited", approver="carol", args=new_args))
    decision = approver(hook).request(req)
    assert decision.verdict == "edit" and decision.args == new_args


def test_immediate_grant_with_pattern(hook: Hook) -> None:
    """A granted answer carries the grant for this tool with its argument globs."""
    req = make_request()
    grant = {"tool": "send_email", "args": {"to": "*@partner.org"}}
    hook.respond = lambda r: signed(answer_for(req, "granted", approver="dan", grant=grant))
    decision = approver(hook).request(req)
    assert decision.verdict == "grant" and decision.grant is not None
    assert decision.grant.as_dict() == grant


def test_pending_then_poll_then_decided(hook: Hook) -> None:
    """A pending answer is polled with signed GETs until a decision arrives."""
    req = make_request()
    polls: list[int] = []

    def respond(got: Received) -> Reply:
        if got.method == "POST":
            return signed(answer_for(req, "pending", poll=f"/status/{req.call_id}"), status=202)
        polls.append(1)
        return signed(answer_for(req, "pending" if len(polls) < 3 else "approved", approver="erin"))

    hook.respond = respond
    decision = approver(hook).request(req)
    assert decision.verdict == "approve" and decision.approver.endswith("/erin")
    gets = [g for g in hook.received if g.method == "GET"]
    assert len(gets) == 3 and all(g.path == f"/status/{req.call_id}" for g in gets)
    for g in gets:
        verify(SECRET, g.headers["X-Proctor-Timestamp"], g.headers["X-Proctor-Signature"],
               f"GET /status/{req.call_id}".encode())


def test_expiry_while_pending_is_a_timed_out_deny(hook: Hook) -> None:
    """When the request expires while still pending, the answer is a deny marked timed out."""
    req = make_request(expires_in=0.4)
    hook.respond = lambda r: signed(answer_for(req, "pending", poll="/status"))
    started = time.monotonic()
    decision = approver(hook).request(req)
    assert decision.verdict == "deny" and decision.timed_out and "still pending" in decision.reason
    assert 0.3 < time.monotonic() - started < 2.0


def test_own_timeout_shorter_than_expiry(hook: Hook) -> None:
    """The approver's own timeout bounds the wait when it is shorter than the expiry."""
    req = make_request(expires_in=60)
    hook.respond = lambda r: signed(answer_for(req, "pending", poll="/status"))
    decision = approver(hook, timeout=0.3).request(req)
    assert decision.timed_out and "within 0.3s" in decision.reason


def test_slow_server_beyond_request_timeout_denies(hook: Hook) -> None:
    """A server slower than request_timeout is a deny naming the timeout."""
    req = make_request()
    hook.respond = lambda r: Reply(b"{}", delay=0.8)
    started = time.monotonic()
    decision = approver(hook, request_timeout=0.2).request(req)
    assert decision.verdict == "deny" and not decision.timed_out
    assert "did not answer the request within 0.2s" in decision.reason
    assert time.monotonic() - started < 0.7


def test_server_dying_mid_wait_denies(hook: Hook) -> None:
    """A server that goes away while we poll is a deny naming the connection error."""
    req = make_request()

    def respond(got: Received) -> Reply:
        threading.Thread(target=hook.stop, daemon=True).start()
        return signed(answer_for(req, "pending", poll="/status"))

    hook.respond = respond
    decision = approver(hook, poll_interval=0.3).request(req)
    assert decision.verdict == "deny" and "cannot reach" in decision.reason and "(poll)" in decision.reason


def test_unreachable_server_denies() -> None:
    """Nothing listening on the port is a deny, never an exception."""
    req = make_request()
    decision = WebhookApprover("http://127.0.0.1:9/approve", secret=SECRET, request_timeout=0.5).request(req)
    assert decision.verdict == "deny" and decision.reason.startswith("cannot reach webhook:127.0.0.1:9")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"call_id": "call_other"}, "answered for another call"),
        ({"binding": "0" * 64}, "binding for other arguments"),
        ({"call_id": None}, "answered for another call"),
    ],
)
def test_answer_for_another_call_denies(hook: Hook, change: dict[str, Any], message: str) -> None:
    """A correctly signed approval for another call or binding is a deny."""
    req = make_request()
    hook.respond = lambda r: signed({**answer_for(req, "approved"), **change})
    decision = approver(hook).request(req)
    assert decision.verdict == "deny" and message in decision.reason


def test_poll_answer_for_another_call_denies(hook: Hook) -> None:
    """The identity check applies to every poll answer too."""
    req = make_request()
    other = make_request(call_id="call_other")
    hook.respond = lambda r: signed(
        answer_for(req, "pending", poll="/s") if r.method == "POST" else answer_for(other, "approved")
    )
    decision = approver(hook).request(req)
    assert decision.verdict == "deny" and "another call" in decision.reason


@pytest.mark.parametrize(
    ("make_reply", "message"),
    [
        (lambda body: Reply(body), "missing X-Proctor-Timestamp"),
        (lambda body: Reply(body, headers=signed_headers("wrong-secret", body)), "does not match"),
        (lambda body: Reply(body, headers=signed_headers(SECRET, body + b" ")), "does not match"),
        (lambda body: Reply(body, headers=signed_headers(SECRET, body, now=time.time() - 600)), "replay window"),
        (lambda body: Reply(body, headers=signed_headers(SECRET, body, now=time.time() + 600)), "replay window"),
    ],
    ids=["unsigned", "wrong-secret", "altered-body", "stale", "future"],
)
def test_badly_signed_answers_deny(hook: Hook, make_reply: Callable[[bytes], Reply], message: str) -> None:
    """An approval that is unsigned, forged, altered or outside the replay window is a deny."""
    req = make_request()
    body = json.dumps(answer_for(req, "approved")).encode()
    hook.respond = lambda r: make_reply(body)
    decision = approver(hook).request(req)
    assert decision.verdict == "deny" and "answer rejected" in decision.reason and message in decision.reason


def test_bad_json_denies(hook: Hook) -> None:
    """A signed body that is not JSON (or not an object) is a deny."""
    for body, message in ((b"approved!", "invalid JSON"), (b"[1, 2]", "JSON list, expected an object")):
        hook.respond = lambda r, body=body: Reply(body, headers=signed_headers(SECRET, body))
        decision = approver(hook).request(make_request())
        assert decision.verdict == "deny" and message in decision.reason


@pytest.mark.parametrize(("status", "word"), [(500, "server error"), (503, "server error"), (403, "refusal"),
                                              (302, "unexpected status")])
def test_http_errors_deny(hook: Hook, status: int, word: str) -> None:
    """5xx, 4xx and redirects (never followed) are denies naming the status."""
    req = make_request()
    hook.respond = lambda r: Reply(b"{}", status=status, headers={"Location": "http://127.0.0.1:9/elsewhere"})
    decision = approver(hook).request(req)
    assert decision.verdict == "deny" and f"HTTP {status} ({word})" in decision.reason
    assert len(hook.received) == 1


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ({"status": "maybe"}, "unknown status"),
        ({"status": "edited"}, "without an args object"),
        ({"status": "granted", "grant": {"tool": "charge_card"}}, "granted another tool"),
        ({"status": "granted", "grant": {"args": {"to": 5}}}, "glob strings"),
        ({"status": "pending"}, "without a poll URL"),
        ({"status": "pending", "poll": "file:///etc/passwd"}, "another origin"),
        ({"status": "approved", "version": 2}, "wire version 2"),
    ],
)
def test_malformed_decisions_deny(hook: Hook, answer: dict[str, Any], message: str) -> None:
    """Signed but meaningless answers are denies that say what was wrong."""
    req = make_request()
    hook.respond = lambda r: signed({**answer_for(req, "approved"), **answer})
    decision = approver(hook).request(req)
    assert decision.verdict == "deny" and message in decision.reason


def test_denied_without_reason_names_the_service(hook: Hook) -> None:
    """A deny answer with no reason still gets one."""
    req = make_request()
    hook.respond = lambda r: signed(answer_for(req, "denied"))
    decision = approver(hook).request(req)
    assert decision.reason == f"denied by {decision.approver}" and decision.approver.startswith("webhook:127.0.0.1:")


def test_already_expired_request_is_not_sent(hook: Hook) -> None:
    """A request past its expiry is a timed-out deny without any HTTP traffic."""
    decision = approver(hook).request(make_request(expires_in=-1))
    assert decision.timed_out and hook.received == []


def test_construction_checks_and_secret_stays_out_of_repr() -> None:
    """Bad URLs, empty secrets and non-positive timeouts are refused; repr never shows the secret."""
    with pytest.raises(ValueError, match="http"):
        WebhookApprover("ftp://x/approve", secret=SECRET)
    with pytest.raises(ValueError, match="secret"):
        WebhookApprover("https://x/approve", secret="")
    with pytest.raises(ValueError, match="poll_interval"):
        WebhookApprover("https://x/approve", secret=SECRET, poll_interval=0)
    hook_approver = WebhookApprover("https://hooks.example.com:8443/approve", secret=SECRET)
    assert SECRET not in repr(hook_approver) and hook_approver.name == "webhook:hooks.example.com:8443"
    assert isinstance(hook_approver, Approver)


def test_signature_helpers_are_reexported() -> None:
    """sign/verify are importable from proctor.approval.webhook for Python receivers."""
    assert sign(SECRET, 1, b"") == signed_headers(SECRET, b"", now=1)["X-Proctor-Signature"]
