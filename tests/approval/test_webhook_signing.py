"""Tests for the webhook signature helpers."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from proctor.approval.webhook import SignatureError, sign, signed_headers, verify

SECRET = "whsec_test"
BODY = b'{"call_id":"call_1"}'


def test_sign_is_hmac_sha256_over_timestamp_dot_body() -> None:
    """The signature is v1= hex HMAC-SHA256 of '<timestamp>.<body>' under the secret."""
    expected = hmac.new(SECRET.encode(), b"1700000000." + BODY, hashlib.sha256).hexdigest()
    assert sign(SECRET, 1700000000, BODY) == f"v1={expected}"
    assert sign(SECRET.encode(), 1700000000, BODY.decode()) == f"v1={expected}"


def test_verify_accepts_a_fresh_signature_and_returns_its_timestamp() -> None:
    """A signature made now verifies and yields its timestamp."""
    headers = signed_headers(SECRET, BODY, now=1700000000.7)
    ts = verify(SECRET, headers["X-Proctor-Timestamp"], headers["X-Proctor-Signature"], BODY, now=1700000010)
    assert ts == 1700000000


def test_verify_accepts_any_of_several_signatures_for_rotation() -> None:
    """During secret rotation one matching v1= value among several is enough."""
    header = f"{sign('old', 1700000000, BODY)}, {sign(SECRET, 1700000000, BODY)}"
    assert verify(SECRET, "1700000000", header, BODY, now=1700000000) == 1700000000


@pytest.mark.parametrize(
    ("timestamp", "signature", "body", "message"),
    [
        (None, "v1=00", BODY, "missing X-Proctor-Timestamp"),
        ("1700000000", None, BODY, "missing X-Proctor-Signature"),
        ("17e8", "v1=00", BODY, "not integer unix seconds"),
        ("1699999000", sign(SECRET, 1699999000, BODY), BODY, "outside the 300s replay window"),
        ("1700000000", sign("other", 1700000000, BODY), BODY, "does not match"),
        ("1700000000", sign(SECRET, 1700000000, BODY), BODY + b" ", "does not match"),
        ("1700000001", sign(SECRET, 1700000000, BODY), BODY, "does not match"),
        ("1700000000", "v0=abc", BODY, "no v1= value"),
    ],
)
def test_verify_rejects_with_a_reason(timestamp: str | None, signature: str | None, body: bytes, message: str) -> None:
    """Missing, malformed, stale, forged or altered messages are refused, saying which."""
    with pytest.raises(SignatureError, match=message):
        verify(SECRET, timestamp, signature, body, now=1700000000)


def test_empty_secret_is_refused() -> None:
    """An empty secret would sign anything: it is refused."""
    with pytest.raises(ValueError, match="must not be empty"):
        sign("", 1, BODY)
