"""docs/approvals.md stays true: its worked signature example and its receiver example are run here."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from approval_helpers import make_request

from proctor.approval import ApprovalDecision, WebhookApprover
from proctor.approval.webhook import sign

DOC = (Path(__file__).parents[2] / "docs" / "approvals.md").read_text(encoding="utf-8")


def field(name: str, after: str = "") -> str:
    start = DOC.index(after) if after else 0
    match = re.compile(rf"^{name}\s+= (.*)$", re.M).search(DOC, start)
    assert match, name
    return match.group(1)


def test_worked_example_signatures_match_the_code() -> None:
    """The request, answer and poll signatures printed in the doc are what sign() computes."""
    secret, ts, body = field("secret"), int(field("timestamp")), field("body")
    assert len(body.encode()) == 578
    assert sign(secret, ts, body) == field("signature")
    answer = field("body", after="An answer to it")
    assert sign(secret, 1767225605, answer) == field("signature", after="An answer to it")
    assert f"`{sign(secret, 1767225605, b'GET /proctor/status/call_7d3f')}`" in DOC


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[dict[str, Any], str]]:
    """Exec the doc's receiver.py block and serve it on a free localhost port."""
    monkeypatch.delenv("PROCTOR_WEBHOOK_SECRET", raising=False)
    block = DOC.split("<!-- receiver.py: the test suite runs this block -->\n```python\n", 1)[1].split("```", 1)[0]
    assert 40 <= len(block.splitlines()) <= 60
    namespace: dict[str, Any] = {"__name__": "receiver_doc"}
    exec(compile(block, "docs/approvals.md#receiver.py", "exec"), namespace)
    server = ThreadingHTTPServer(("127.0.0.1", 0), namespace["Handler"])
    server.daemon_threads = True
    namespace["Handler"].log_message = lambda self, *args: None
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield namespace, f"http://127.0.0.1:{server.server_address[1]}/proctor"
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_receiver_example_approves_company_mail(receiver: tuple[dict[str, Any], str]) -> None:
    """Mail to the company domain is approved at once by the example receiver."""
    _, url = receiver
    req = make_request(args={"to": "carol@example.com", "subject": "s", "body": "b"})
    decision = WebhookApprover(url, secret="whsec_demo_5f3a", request_timeout=2).request(req)
    assert decision.verdict == "approve" and decision.approver.endswith("/rule:company-mail")


def test_receiver_example_waits_for_a_human(receiver: tuple[dict[str, Any], str]) -> None:
    """Other mail stays pending until decide() is called, and the poll then returns the decision."""
    namespace, url = receiver
    req = make_request()
    results: list[ApprovalDecision] = []
    approver = WebhookApprover(url, secret="whsec_demo_5f3a", poll_interval=0.05, request_timeout=2, timeout=10)
    thread = threading.Thread(target=lambda: results.append(approver.request(req)))
    thread.start()
    deadline = time.monotonic() + 5
    while req.call_id not in namespace["WAITING"] and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # a few polls come back pending first
    namespace["decide"](req.call_id, "denied", "carol", "not to partners")
    thread.join(10)
    (decision,) = results
    assert (decision.verdict, decision.reason) == ("deny", "not to partners")
    assert decision.approver.endswith("/carol") and not decision.timed_out


def test_receiver_example_refuses_a_wrong_secret(receiver: tuple[dict[str, Any], str]) -> None:
    """The example receiver refuses unsigned requests, which proctor then reports as a deny."""
    _, url = receiver
    decision = WebhookApprover(url, secret="not-the-secret", request_timeout=2).request(make_request())
    assert decision.verdict == "deny" and "HTTP 401" in decision.reason
