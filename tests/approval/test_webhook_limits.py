"""The webhook approver against hostile servers: slow drips, polls sent elsewhere, replayed poll signatures."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from approval_helpers import make_request

from proctor.approval import WebhookApprover
from proctor.approval.signing import SignatureError, request_payload, signed_headers, verify

SECRET = "limits-secret"


class DripServer:
    """A raw TCP server on a free localhost port that answers every connection one byte every `gap` seconds."""

    def __init__(self, reply: bytes, gap: float) -> None:
        self.reply, self.gap = reply, gap
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.open_connections = 0
        self.closed_by_client = threading.Event()
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        self.open_connections += 1
        try:
            conn.recv(65536)
            for byte in self.reply:
                conn.sendall(bytes([byte]))
                time.sleep(self.gap)
        except OSError:
            self.closed_by_client.set()
        finally:
            self.open_connections -= 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()


@pytest.fixture
def drip() -> Iterator[DripServer]:
    body = b'{"status":"approved"}'
    reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    server = DripServer(reply, gap=0.2)  # ~18 s for the whole reply; each byte well within any per-read timeout
    yield server
    server.close()


def test_a_slow_drip_server_cannot_hold_the_exchange(drip: DripServer) -> None:
    """One byte at a time keeps every read alive; the whole exchange still ends near request_timeout."""
    approver = WebhookApprover(f"http://127.0.0.1:{drip.port}/approve", secret=SECRET, timeout=60, request_timeout=1.0)
    threads_before = threading.active_count()
    started = time.monotonic()
    decision = approver.request(make_request(expires_in=120))
    elapsed = time.monotonic() - started
    assert decision.verdict == "deny" and "did not answer the request within 1s" in decision.reason
    assert elapsed < 10, elapsed  # the drip alone takes ~18 s; generous for a loaded machine
    assert drip.closed_by_client.wait(10)  # we hung up: no socket left behind
    deadline = time.monotonic() + 10
    while threading.active_count() > threads_before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= threads_before + 2  # the server's own threads at most; no watchdog left


def test_the_overall_deadline_cuts_a_drip_too(drip: DripServer) -> None:
    """With the approval about to expire, the exchange ends by the expiry as a timed-out deny."""
    approver = WebhookApprover(f"http://127.0.0.1:{drip.port}/approve", secret=SECRET, timeout=60, request_timeout=30)
    decision = approver.request(make_request(expires_in=1.0))
    assert decision.verdict == "deny" and decision.timed_out


class Pending:
    """A real HTTP server answering `pending` with a poll URL we choose, and recording every request."""

    def __init__(self, poll: str) -> None:
        import json
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        outer = self
        self.requests: list[tuple[str, str, dict[str, str]]] = []

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                outer.requests.append((self.command, self.path, dict(self.headers.items())))
                req = json.loads(raw) if raw else outer.last
                outer.last = req
                body = json.dumps({"status": "pending", "call_id": req["call_id"], "binding": req["binding"],
                                   "poll": poll.format(port=outer.port)}).encode()
                self.send_response(202)
                for name, value in {**signed_headers(SECRET, body), "Content-Length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.last: dict[str, Any] = {}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("poll", [
    "http://evil.test/steal",                  # another host
    "http://127.0.0.2:{port}/status",          # another address
    "http://localhost:{port}/status",          # another host name for the same server
    "https://127.0.0.1:{port}/status",         # another scheme
    "http://127.0.0.1:1/status",               # another port
    "//evil.test/status",                      # scheme-relative
    "ftp://127.0.0.1:{port}/status",
    "file:///etc/passwd",
])
def test_polls_never_leave_the_webhook_origin(poll: str) -> None:
    """A signed pending answer pointing polls elsewhere is a deny, and nothing is sent there."""
    server = Pending(poll)
    try:
        approver = WebhookApprover(f"http://127.0.0.1:{server.port}/approve", secret=SECRET, timeout=5,
                                   poll_interval=0.05, request_timeout=2)
        decision = approver.request(make_request(expires_in=30))
    finally:
        server.close()
    assert decision.verdict == "deny" and "another origin" in decision.reason
    assert [m for m, _, _ in server.requests] == ["POST"]


def test_same_origin_polls_are_signed_over_method_and_path() -> None:
    """A relative poll URL is polled on the same origin; its signature verifies only for that method and path."""
    server = Pending("/status/c1?x=1")
    try:
        approver = WebhookApprover(f"http://127.0.0.1:{server.port}/approve", secret=SECRET, timeout=0.6,
                                   poll_interval=0.05, request_timeout=2)
        decision = approver.request(make_request(expires_in=30))
    finally:
        server.close()
    assert decision.timed_out  # still pending at the end
    gets = [(path, headers) for method, path, headers in server.requests if method == "GET"]
    assert gets and all(path == "/status/c1?x=1" for path, _ in gets)
    _, headers = gets[0]
    ts, sig = headers["X-Proctor-Timestamp"], headers["X-Proctor-Signature"]
    verify(SECRET, ts, sig, request_payload("GET", "/status/c1?x=1"))
    for other in (request_payload("GET", "/status/c2?x=1"), request_payload("GET", "/status/c1"),
                  request_payload("DELETE", "/status/c1?x=1"), b""):
        with pytest.raises(SignatureError):
            verify(SECRET, ts, sig, other)


def test_a_deeply_nested_signed_answer_is_a_plain_deny() -> None:
    """A signed answer of 100,000 nested lists is refused as invalid JSON, not a RecursionError."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = b"[" * 100_000 + b"]" * 100_000

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            for name, value in {**signed_headers(SECRET, body), "Content-Length": str(len(body))}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        approver = WebhookApprover(f"http://127.0.0.1:{server.server_address[1]}/approve", secret=SECRET, timeout=5)
        decision = approver.request(make_request(expires_in=30))
    finally:
        server.shutdown()
        server.server_close()
    assert decision.verdict == "deny" and "invalid JSON" in decision.reason and "nested deeper" in decision.reason
