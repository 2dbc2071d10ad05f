"""Caps on text leaving the gate: span status, attributes and events, and error text in audit records.

A program controls the text of its own errors (a 6 MB argument quoted in "invalid
call: …"), and a tool's exception message can be anything. Unbounded, one such call
made a 6 MB span export batch that the collector refused, losing the spans of the
calls exported with it. Every string the telemetry layer hands to a span, and the
error text of every audit record, is cut here to a fixed size; what was cut is named
by its length and SHA-256, so the full text can still be matched against a copy.

- span status description, each string attribute, each event attribute (also the
  exception's message): `MAX_SPAN_TEXT` = 4,096 characters; the cut is named in the
  text itself: ``… [cut: 6000000 chars, sha256 ab12…]``;
- list attributes (rules, …): `MAX_SPAN_LIST` = 128 items, each capped;
- `error` in `call_intent` / `call_outcome` records: `MAX_AUDIT_ERROR` = 8,192
  characters, with ``error_cut: {"chars": N, "sha256": hex}`` beside it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAX_AUDIT_ERROR",
    "MAX_SPAN_LIST",
    "MAX_SPAN_TEXT",
    "cap_attribute",
    "cap_attributes",
    "cap_text",
    "error_fields",
]

MAX_SPAN_TEXT = 4096
MAX_SPAN_LIST = 128
MAX_AUDIT_ERROR = 8192


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def cap_text(text: str, limit: int = MAX_SPAN_TEXT) -> str:
    """`text` if it is at most `limit` characters, else its first part and a marker naming
    the full length and SHA-256 (the result is at most `limit` characters plus ~100)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [cut: {len(text)} chars, sha256 {_digest(text)}]"


def cap_attribute(value: Any, limit: int = MAX_SPAN_TEXT) -> Any:
    """An OpenTelemetry attribute value with every string capped and lists shortened."""
    if isinstance(value, str):
        return cap_text(value, limit)
    if isinstance(value, (list, tuple)):
        items = [cap_text(v, limit) if isinstance(v, str) else v for v in value[:MAX_SPAN_LIST]]
        if len(value) > MAX_SPAN_LIST:
            if all(isinstance(v, str) for v in items):
                items.append(f"… [cut: {len(value) - MAX_SPAN_LIST} more items]")
            # (a list of numbers is just shortened: attributes are homogeneous)
        return items
    return value


def cap_attributes(attributes: Mapping[str, Any] | None, limit: int = MAX_SPAN_TEXT) -> dict[str, Any]:
    """`attributes` (span or event) with every value capped by `cap_attribute`."""
    if not attributes:
        return {}
    return {key: cap_attribute(value, limit) for key, value in attributes.items()}


def error_fields(error: object | None, limit: int = MAX_AUDIT_ERROR) -> dict[str, Any]:
    """The `error` field of an audit record (None stays None), capped to `limit` characters;
    when cut, an `error_cut` field with the full text's length and SHA-256 beside it."""
    if error is None:
        return {"error": None}
    text = str(error)
    if len(text) <= limit:
        return {"error": text}
    return {"error": text[:limit] + "…", "error_cut": {"chars": len(text), "sha256": _digest(text)}}
