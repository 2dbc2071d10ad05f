"""Ask an HTTP service: POST the request, signed; read a signed decision, polling if pending.

The wire format is specified in docs/approvals.md. Every way this can go wrong —
the service is down, slow, answers 5xx, garbage, an unsigned or stale or forged
answer, an answer for another call, or no decision before the request expires —
is a deny whose reason names it; `request()` never raises.

Plain ``http.client`` (no extra dependency). Redirects are not followed: a
redirect could move a signed request to a host the secret was not meant for; for the
same reason a poll URL must be on the webhook URL's origin (scheme, host and port).
Each exchange ends within `request_timeout` as a whole, not per read.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

from proctor.approval.base import ApprovalDecision, ApprovalRequest, Grant
from proctor.approval.grants import GrantPattern
from proctor.approval.signing import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    SignatureError,
    request_payload,
    sign,
    signed_headers,
    verify,
)
from proctor.errors import ConfigurationError
from proctor.jsoninput import loads_bounded

__all__ = ["WIRE_VERSION", "SignatureError", "WebhookApprover", "sign", "signed_headers", "verify"]

WIRE_VERSION = 1
MAX_ANSWER_BYTES = 1 << 20
_STATUS_VERDICT = {"approved": "approve", "denied": "deny", "edited": "edit", "granted": "grant"}


class _Deny(Exception):
    """Stop asking: deny with this reason."""

    def __init__(self, reason: str, *, timed_out: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.timed_out = timed_out


def _origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) with the scheme's default port filled in."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = -1
    return scheme, (parts.hostname or "").lower(), port or (443 if scheme == "https" else 80)


def _origin_text(url: str) -> str:
    scheme, host, port = _origin(url)
    return f"{scheme}://{host}:{port}"


def _http(method: str, parts: urllib.parse.SplitResult, target: str, body: bytes, headers: Mapping[str, str],
          budget: float) -> tuple[int, Any, bytes]:
    """One HTTP exchange that ends within `budget` seconds whatever the server does; raises
    TimeoutError when time runs out. Redirects are never followed (a 3xx is just a status)."""
    host = parts.hostname or ""
    if parts.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, parts.port, timeout=budget, context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(host, parts.port, timeout=budget)
    fired = threading.Event()

    def cut() -> None:  # the watchdog: wake any blocked recv/send at the deadline
        fired.set()
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(budget, cut)
    timer.daemon = True
    timer.start()
    try:
        conn.connect()
        if fired.is_set():
            raise TimeoutError("connect")
        conn.request(method, target, body=body if method == "POST" else None, headers=dict(headers))
        response = conn.getresponse()
        raw = response.read(MAX_ANSWER_BYTES + 1)
        if fired.is_set():
            raise TimeoutError("exchange")
        return response.status, response.headers, raw
    except (OSError, http.client.HTTPException):
        if fired.is_set():
            raise TimeoutError("exchange") from None
        raise
    finally:
        timer.cancel()
        conn.close()


def encode_request(request: ApprovalRequest) -> bytes:
    """The POST body: the request's fields plus ``"version"``, as compact sorted JSON."""
    payload = {**request.as_dict(), "version": WIRE_VERSION}
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


class WebhookApprover:
    """POST each request to `url` signed with `secret`; wait at most `timeout` seconds for a decision.

    `poll_interval` is the pause between polls of a pending request, `replay_window`
    how far an answer's timestamp may be from our clock, and `request_timeout` the
    limit on each whole HTTP exchange (connect to last byte, however slowly it comes).
    """

    def __init__(
        self,
        url: str,
        *,
        secret: str | bytes,
        timeout: float = 300.0,
        poll_interval: float = 1.0,
        replay_window: float = 300.0,
        request_timeout: float = 10.0,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(f"webhook URL must be http(s)://host/..., got {url!r}")
        if not secret:
            raise ConfigurationError("the webhook secret must not be empty")
        for label, value in (("timeout", timeout), ("poll_interval", poll_interval),
                             ("replay_window", replay_window), ("request_timeout", request_timeout)):
            if value <= 0:
                raise ConfigurationError(f"WebhookApprover {label} must be positive seconds")
        self.url = url
        self._secret = secret
        self.timeout = timeout
        self.poll_interval = poll_interval
        self.replay_window = replay_window
        self.request_timeout = request_timeout
        host = parts.hostname + (f":{parts.port}" if parts.port else "")
        self.name = f"webhook:{host}"

    def __repr__(self) -> str:
        return f"WebhookApprover({self.url!r}, timeout={self.timeout!r})"  # never the secret

    def request(self, request: ApprovalRequest) -> ApprovalDecision:
        try:
            return self._request(request)
        except _Deny as deny:
            return ApprovalDecision.deny(request, self.name, deny.reason, timed_out=deny.timed_out)
        except Exception as exc:  # noqa: BLE001 - the contract is "never raise": an unforeseen error denies too
            return ApprovalDecision.deny(request, self.name, f"webhook approver failed: {type(exc).__name__}: {exc}")

    # -- internals -----------------------------------------------------------------

    def _request(self, request: ApprovalRequest) -> ApprovalDecision:
        expires_in = (request.expires_at_ns - time.time_ns()) / 1e9
        limit = min(self.timeout, expires_in)
        if limit <= 0:
            raise _Deny("the approval request expired before it was sent", timed_out=True)
        deadline = time.monotonic() + limit
        try:
            body = encode_request(request)
        except (TypeError, ValueError) as exc:
            raise _Deny(f"cannot encode the approval request as JSON: {exc}") from exc
        answer = self._exchange("POST", self.url, body, deadline, limit)
        poll_url: str | None = None
        while True:
            self._check_identity(request, answer)
            status = answer.get("status")
            if status != "pending":
                return self._decision(request, answer)
            poll_url = self._poll_url(answer, poll_url)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Deny(f"no decision from {self.name} within {limit:g}s (still pending)", timed_out=True)
            time.sleep(min(self.poll_interval, remaining))
            if deadline - time.monotonic() <= 0:
                raise _Deny(f"no decision from {self.name} within {limit:g}s (still pending)", timed_out=True)
            try:
                answer = self._exchange("GET", poll_url, b"", deadline, limit)
            except _Deny as deny:
                if deny.timed_out and deadline - time.monotonic() <= 0.05:  # the deadline cut the poll short
                    raise _Deny(f"no decision from {self.name} within {limit:g}s (still pending)",
                                timed_out=True) from None
                raise

    def _exchange(self, method: str, url: str, body: bytes, deadline: float, limit: float) -> dict[str, Any]:
        """One signed HTTP exchange; returns the verified JSON object or raises _Deny.

        The whole exchange — connect, send, status line, headers, body — ends by
        `request_timeout` (and by the overall deadline): a watchdog shuts the socket down
        when time is up, so a server dripping one byte at a time cannot hold it, and no
        thread or socket outlives it.
        """
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Deny(f"no decision from {self.name} within {limit:g}s", timed_out=True)
        parts = urllib.parse.urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = {"Accept": "application/json", "User-Agent": "proctor-approval/1"}
        # A poll has no body: its signature covers the method and the path with its query.
        headers.update(signed_headers(self._secret, body if method == "POST" else request_payload(method, target)))
        if method == "POST":
            headers["Content-Type"] = "application/json"
        what = "request" if method == "POST" else "poll"
        budget = min(self.request_timeout, remaining)
        cut_by_deadline = budget < self.request_timeout
        try:
            status, answer_headers, raw = _http(method, parts, target, body, headers, budget)
        except TimeoutError as exc:
            if cut_by_deadline:  # our overall deadline cut this exchange short
                raise _Deny(f"no decision from {self.name} within {limit:g}s", timed_out=True) from exc
            raise _Deny(f"{self.name} did not answer the {what} within {self.request_timeout:g}s") from exc
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise _Deny(f"cannot reach {self.name} ({what}): {exc}") from exc
        if not 200 <= status < 300:
            kind = "server error" if status >= 500 else "refusal" if status >= 400 else "unexpected status"
            raise _Deny(f"{self.name} answered the {what} with HTTP {status} ({kind})")
        if len(raw) > MAX_ANSWER_BYTES:
            raise _Deny(f"{self.name} answered with more than {MAX_ANSWER_BYTES} bytes")
        try:
            verify(self._secret, answer_headers.get(TIMESTAMP_HEADER), answer_headers.get(SIGNATURE_HEADER), raw,
                   replay_window=self.replay_window)
        except SignatureError as exc:
            raise _Deny(f"{self.name} answer rejected: {exc}") from exc
        try:
            answer = loads_bounded(raw.decode("utf-8"), "answer", max_bytes=MAX_ANSWER_BYTES)
        except (UnicodeDecodeError, ValueError) as exc:
            raise _Deny(f"{self.name} answered with invalid JSON: {exc}") from exc
        if not isinstance(answer, dict):
            raise _Deny(f"{self.name} answered with JSON {type(answer).__name__}, expected an object")
        return answer

    def _check_identity(self, request: ApprovalRequest, answer: Mapping[str, Any]) -> None:
        version = answer.get("version", WIRE_VERSION)
        if version != WIRE_VERSION:
            raise _Deny(f"{self.name} answered in wire version {version!r}; this proctor speaks {WIRE_VERSION}")
        if answer.get("call_id") != request.call_id:
            raise _Deny(f"{self.name} answered for another call (call_id {str(answer.get('call_id'))[:80]!r})")
        if answer.get("binding") != request.binding:
            raise _Deny(f"{self.name} answered with a binding for other arguments, another call or another policy")

    def _poll_url(self, answer: Mapping[str, Any], previous: str | None) -> str:
        poll = answer.get("poll")
        if poll is None and previous is not None:
            return previous
        if not isinstance(poll, str) or not poll:
            raise _Deny(f"{self.name} answered pending without a poll URL")
        url = urllib.parse.urljoin(self.url, poll)
        if _origin(url) != _origin(self.url):
            # A signed `pending` must not send our signed polls to another host, port or scheme
            # (plain http in place of https, say).
            raise _Deny(f"{self.name} gave a poll URL on another origin than {_origin_text(self.url)}: "
                        f"{poll[:80]!r}")
        return url

    def _decision(self, request: ApprovalRequest, answer: Mapping[str, Any]) -> ApprovalDecision:
        status = answer.get("status")
        verdict = _STATUS_VERDICT.get(status) if isinstance(status, str) else None
        if verdict is None:
            raise _Deny(f"{self.name} answered with unknown status {str(status)[:40]!r}")
        who = answer.get("approver")
        approver = f"{self.name}/{str(who)[:200]}" if isinstance(who, str) and who else self.name
        reason = answer.get("reason")
        reason = str(reason)[:2000] if reason else ""
        # What the service proved is its signature over the answer: the name inside is its word.
        facts: dict[str, Any] = {"method": "webhook-signature", "answered_at_ns": time.time_ns(),
                                 "address": _origin_text(self.url)}
        if verdict == "approve":
            return ApprovalDecision("approve", request.binding, approver, reason, **facts)
        if verdict == "deny":
            return ApprovalDecision("deny", request.binding, approver, reason or f"denied by {approver}", **facts)
        if verdict == "edit":
            args = answer.get("args")
            if not isinstance(args, dict):
                raise _Deny(f"{self.name} answered edited without an args object")
            return ApprovalDecision("edit", request.binding, approver, reason, args=args, **facts)
        return ApprovalDecision("grant", request.binding, approver, reason, grant=self._grant(request, answer),
                                **facts)

    def _grant(self, request: ApprovalRequest, answer: Mapping[str, Any]) -> Grant:
        grant = answer.get("grant") or {}
        if not isinstance(grant, dict):
            raise _Deny(f"{self.name} answered granted with a grant that is not an object")
        tool = grant.get("tool", request.tool)
        if tool != request.tool:
            # A grant rides on approving *this* call; widening it to another tool is not ours to accept.
            raise _Deny(f"{self.name} granted another tool ({str(tool)[:80]!r}) than the one asked about")
        patterns = grant.get("args") or {}
        if not isinstance(patterns, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in patterns.items()
        ):
            raise _Deny(f"{self.name} answered granted with grant.args that is not an object of glob strings")
        for name, text in patterns.items():
            try:
                GrantPattern.parse(text)
            except ValueError as exc:  # a pattern we cannot read admits nothing: refuse the whole answer
                raise _Deny(f"{self.name} answered granted with a bad pattern for {name[:40]!r}: {exc}") from None
        return Grant(request.tool, dict(patterns))
