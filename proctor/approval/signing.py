"""HMAC-SHA256 signatures for the approval webhook, in both directions.

The scheme (Stripe-style, documented in docs/approvals.md so any language can
implement it):

- ``X-Proctor-Timestamp: <unix seconds, integer>``
- ``X-Proctor-Signature: v1=<hex hmac_sha256(secret, "<timestamp>." + body)>``

`body` is the exact bytes sent. A request without a body (proctor's poll ``GET``) signs
`request_payload(method, target)` instead — ``GET /proctor/status/call_7d3f`` — so the
signature covers the method and the path with its query: a captured poll signature
cannot be replayed against another path. Several ``v1=`` values may be
given, comma-separated, so a receiver can sign with an old and a new secret while
rotating; one match is enough. The timestamp is signed too, and must be within the
replay window of the verifier's clock, so a captured message cannot be replayed
later.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from proctor.errors import SignatureError

__all__ = [
    "SIGNATURE_HEADER",
    "SIGNATURE_SCHEME",
    "TIMESTAMP_HEADER",
    "SignatureError",
    "request_payload",
    "sign",
    "signed_headers",
    "verify",
]

TIMESTAMP_HEADER = "X-Proctor-Timestamp"
SIGNATURE_HEADER = "X-Proctor-Signature"
SIGNATURE_SCHEME = "v1"


def _key(secret: str | bytes) -> bytes:
    key = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    if not key:
        # An empty key signs everything an attacker can compute: refuse it outright.
        raise ValueError("the webhook secret must not be empty")
    return key


def _body(body: str | bytes) -> bytes:
    return body.encode("utf-8") if isinstance(body, str) else bytes(body)


def request_payload(method: str, target: str) -> bytes:
    """What a request without a body signs: ``"<METHOD> <path?query>"`` (e.g. ``GET /status/c1``)."""
    return f"{method.upper()} {target}".encode()


def sign(secret: str | bytes, timestamp: int, body: str | bytes) -> str:
    """The ``X-Proctor-Signature`` value for `body` sent at `timestamp`: ``v1=<hex>``."""
    if isinstance(timestamp, bool) or not isinstance(timestamp, int):
        raise TypeError("timestamp must be integer unix seconds")
    message = str(timestamp).encode("ascii") + b"." + _body(body)
    digest = hmac.new(_key(secret), message, hashlib.sha256).hexdigest()
    return f"{SIGNATURE_SCHEME}={digest}"


def signed_headers(secret: str | bytes, body: str | bytes, *, now: float | None = None) -> dict[str, str]:
    """Both headers for `body`, timestamped now (or at `now`)."""
    timestamp = int(time.time() if now is None else now)
    return {TIMESTAMP_HEADER: str(timestamp), SIGNATURE_HEADER: sign(secret, timestamp, body)}


def verify(
    secret: str | bytes,
    timestamp: str | int | None,
    signature: str | None,
    body: str | bytes,
    *,
    replay_window: float = 300.0,
    now: float | None = None,
) -> int:
    """Check a message's two headers against its body; return the timestamp or raise `SignatureError`.

    `timestamp` and `signature` are the raw header values (None when absent).
    """
    if timestamp is None or timestamp == "":
        raise SignatureError(f"missing {TIMESTAMP_HEADER} header")
    if not signature:
        raise SignatureError(f"missing {SIGNATURE_HEADER} header")
    text = str(timestamp).strip()
    if not text.isdigit() or len(text) > 12:
        raise SignatureError(f"{TIMESTAMP_HEADER} is not integer unix seconds: {str(timestamp)[:40]!r}")
    ts = int(text)
    current = time.time() if now is None else now
    if abs(current - ts) > replay_window:
        raise SignatureError(
            f"{TIMESTAMP_HEADER} {ts} is {current - ts:+.0f}s from now, outside the {replay_window:g}s replay window"
        )
    expected = sign(secret, ts, body)
    offered = [part.strip() for part in signature.split(",")]
    candidates = [p for p in offered if p.startswith(f"{SIGNATURE_SCHEME}=")]
    if not candidates:
        raise SignatureError(f"{SIGNATURE_HEADER} has no {SIGNATURE_SCHEME}= value")
    # compare_digest on every candidate: no early exit that would leak timing.
    matched = False
    for candidate in candidates:
        matched |= hmac.compare_digest(candidate.encode("utf-8", "replace"), expected.encode("ascii"))
    if not matched:
        raise SignatureError(f"{SIGNATURE_HEADER} does not match the body (wrong secret or altered message)")
    return ts
