"""The approvers work end to end with the real Gate: grants, edits, timeouts, wrong bindings."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from proctor.approval import ApprovalDecision, ApprovalRequest, CallbackApprover, WebhookApprover
from proctor.approval.webhook import signed_headers
from proctor.errors import ApprovalDenied, ApprovalTimeout
from proctor.gate import Gate
from proctor.policy import Policy
from proctor.testing import InMemoryAudit
from proctor.tools import tool

SECRET = "gate-test-secret"
SENT: list[str] = []


@tool(side_effect="external")
def send_email(to: str, body: str) -> str:
    """Send an email.

    Args:
        to: Recipient.
        body: Text.
    """
    SENT.append(to)
    return f"sent to {to}"


def make_gate(approver: Any, timeout: str = "5s") -> Gate:
    policy = Policy.from_dict({
        "version": 1,
        "rules": [{"name": "ask", "match": {"tool": "send_email"}, "decision": "require_approval",
                   "reason": "mail needs a human"}],
        "approval": {"timeout": timeout},
    })
    return Gate(policy, approver=approver, audit=InMemoryAudit(), tools=[send_email])


@pytest.fixture(autouse=True)
def _clear_sent() -> None:
    SENT.clear()


@pytest.fixture
def webhook_url() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A receiver that grants *@partner.org on the first request and stays pending for anything else."""
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, answer: dict[str, Any]) -> None:
            body = json.dumps(answer).encode()
            self.send_response(200)
            for name, value in signed_headers(SECRET, body).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(req)
            echo = {"call_id": req["call_id"], "binding": req["binding"]}
            if req["args"]["to"].endswith("@partner.org"):
                self._reply({**echo, "status": "granted", "approver": "carol",
                             "grant": {"args": {"to": "*@partner.org"}}})
            else:
                self._reply({**echo, "status": "pending", "poll": f"/poll/{req['call_id']}"})

        def do_GET(self) -> None:
            call_id = self.path.rsplit("/", 1)[-1]
            (req,) = [r for r in seen if r["call_id"] == call_id]
            self._reply({"call_id": call_id, "binding": req["binding"], "status": "pending"})

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", seen
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_webhook_grant_covers_later_matching_calls(webhook_url: tuple[str, list[dict[str, Any]]]) -> None:
    """A webhook grant for *@partner.org approves later matching calls without asking again."""
    url, seen = webhook_url
    gate = make_gate(WebhookApprover(url, secret=SECRET, poll_interval=0.05, timeout=0.4))
    ctx = gate.start_run(principal="alice")
    assert gate.call("send_email", {"to": "bob@partner.org", "body": "1"}, context=ctx) == "sent to bob@partner.org"
    assert gate.call("send_email", {"to": "eve@partner.org", "body": "2"}, context=ctx) == "sent to eve@partner.org"
    assert len(seen) == 1
    with pytest.raises(ApprovalTimeout):
        gate.call("send_email", {"to": "mallory@evil.test", "body": "3"}, context=ctx)
    assert SENT == ["bob@partner.org", "eve@partner.org"] and len(seen) == 2


def test_callback_edit_is_decided_again_and_runs_with_new_args() -> None:
    """An edit from a callback runs the tool with the edited arguments."""

    def edit(request: ApprovalRequest) -> ApprovalDecision:
        return ApprovalDecision("edit", request.binding, "bot", "fixed recipient", args={"to": "ops@example.com",
                                                                                      "body": "x"})

    gate = make_gate(CallbackApprover(edit))
    ctx = gate.start_run()
    assert gate.call("send_email", {"to": "ceo@rival.test", "body": "x"}, context=ctx) == "sent to ops@example.com"
    assert SENT == ["ops@example.com"]


def test_callback_answer_for_another_call_is_rejected_by_the_gate() -> None:
    """A callback decision bound to another call passes through the approver and the gate refuses it."""

    def confused(request: ApprovalRequest) -> ApprovalDecision:
        return ApprovalDecision("approve", "0" * 64, "bot")

    gate = make_gate(CallbackApprover(confused))
    with pytest.raises(ApprovalDenied, match="bound to another call"):
        gate.call("send_email", {"to": "a@b.c", "body": "x"}, context=gate.start_run())
    assert SENT == []


def test_callback_exception_is_a_denied_call() -> None:
    """A callback that raises denies the call, naming the exception."""

    def broken(request: ApprovalRequest) -> bool:
        raise RuntimeError("ticket system down")

    gate = make_gate(CallbackApprover(broken))
    with pytest.raises(ApprovalDenied, match="callback raised RuntimeError: ticket system down"):
        gate.call("send_email", {"to": "a@b.c", "body": "x"}, context=gate.start_run())
    assert SENT == []
