"""The record format: envelope fields, sealing a record, and parsing one line strictly.

A record is one line of canonical JSON (`proctor.canonical`: sorted keys, compact
separators, UTF-8, no floats) ending in ``\\n``. The envelope is ``seq`` (0-based, the
record's index and its Merkle leaf index), ``ts_ns``, ``kind``, ``prev`` (the previous
record's ``h``; `GENESIS` for the first) and ``h = sha256(0x00 ‖ canonical record
without h)``, which is also the record's RFC 6962 leaf hash.

Parsing is the verifier's hot path, so it avoids pydantic and per-call decoder
construction: one C scan, one C re-encode compared byte for byte (which also catches
duplicate keys, whitespace and escapes), one hash.
"""

from __future__ import annotations

import hashlib
import json
import json.encoder
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

from proctor.canonical import canonical_bytes, jsonable

__all__ = [
    "CALL_STATUSES",
    "CHECKPOINT_TYPE",
    "CODES",
    "ENVELOPE",
    "GENESIS",
    "LineError",
    "checkpoint_statement",
    "duplicate_key",
    "is_hex64",
    "parse_line",
    "seal",
]

#: `prev` of the first record.
GENESIS = "0" * 64
#: Fields the log writes itself; callers may not supply them.
ENVELOPE = ("seq", "ts_ns", "kind", "prev", "h")
#: `status` values of a `call_outcome` record.
CALL_STATUSES = ("ok", "failed", "denied", "timeout", "unknown")
#: Domain separator inside every signed checkpoint statement.
CHECKPOINT_TYPE = "proctor.audit.checkpoint.v1"
#: Failure codes reported by verification, in the order a reader meets them.
CODES = (
    "PARSE",
    "NONCANONICAL",
    "SEQ_GAP",
    "HASH_MISMATCH",
    "PREV_MISMATCH",
    "CKPT_SIG",
    "CKPT_ROOT",
    "ROLLBACK",
    "FORK",
)

_HEX = frozenset("0123456789abcdef")


class LineError(Exception):
    """One line is not a well-formed record; `code` is PARSE or NONCANONICAL."""

    def __init__(self, code: str, message: str, *, unreadable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        #: True when the line is not JSON at all (what a crash mid-append leaves behind).
        self.unreadable = unreadable


class _FloatSeen(Exception):
    pass


def _no_float(text: str) -> Any:
    raise _FloatSeen(text)


_DECODER = json.JSONDecoder(parse_float=_no_float, parse_constant=_no_float)
_SCAN: Callable[[str, int], tuple[Any, int]] = getattr(_DECODER, "scan_once")  # noqa: B009 - the C scanner
# The same encoder `json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)`
# builds, made once: building it per record costs more than the encoding itself.
_C_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)
_ENCODE: Any = (
    _C_ENCODER(None, None, json.encoder.encode_basestring, None, ":", ",", True, False, True)
    if _C_ENCODER is not None
    else None
)


def _encode(value: Any) -> str:
    if _ENCODE is not None:
        return "".join(_ENCODE(value, 0))
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)  # pragma: no cover


def is_hex64(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) == 64 and _HEX.issuperset(value)


def seal(record: Mapping[str, Any]) -> tuple[bytes, str]:
    """Return (line with trailing newline, h) for a record holding its envelope but no `h`.

    The bytes are exactly `canonical_bytes` of the record (with and without `h`); the
    conversion to plain JSON types runs once and the C encoder is reused, because this
    is on every append's path.
    """
    plain = dict(jsonable(record))
    body = _encode(plain).encode("utf-8")
    h = hashlib.sha256(b"\x00" + body).hexdigest()
    plain["h"] = h
    return _encode(plain).encode("utf-8") + b"\n", h


def duplicate_key(text: str) -> str | None:
    """The first key that appears twice in one object of `text`, if any (slow path, for messages)."""
    found: list[str] = []

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen and not found:
                found.append(key)
            seen.add(key)
        return dict(pairs)

    try:
        json.loads(text, object_pairs_hook=hook)
    except ValueError:
        return None
    return found[0] if found else None


def parse_line(raw: bytes) -> tuple[dict[str, Any], str]:
    """Parse one line (without its newline) into (record, h), checking it is canonical and hashes to `h`.

    Raises `LineError` (PARSE, NONCANONICAL) for malformed lines and returns a record
    whose `h` does not match as ``(record, computed_h)`` so the caller reports HASH_MISMATCH
    with its own position.
    """
    if not raw:
        raise LineError("PARSE", "blank line", unreadable=True)
    if raw[-1] == 13:  # b"\r"
        raise LineError("NONCANONICAL", "CRLF line ending (records end in a bare \\n)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LineError("PARSE", f"not UTF-8 at byte {exc.start} of the line", unreadable=True) from None
    try:
        value, end = _SCAN(text, 0)
    except _FloatSeen as exc:
        raise LineError("NONCANONICAL", f"number {exc} is a float; records hold integers only") from None
    except StopIteration:
        raise LineError("PARSE", "not JSON", unreadable=True) from None
    except (ValueError, RecursionError) as exc:
        raise LineError("PARSE", f"not JSON: {exc}", unreadable=True) from None
    if end != len(text):
        raise LineError(
            "PARSE", f"not JSON: extra data at byte {len(text[:end].encode())} of the line", unreadable=True
        )
    if type(value) is not dict:
        raise LineError("PARSE", "not a JSON object")
    try:
        canonical = _encode(value)
    except (ValueError, TypeError) as exc:  # pragma: no cover - loads never yields unencodable values
        raise LineError("NONCANONICAL", str(exc)) from None
    if canonical != text:
        dup = duplicate_key(text)
        if dup is not None:
            raise LineError("NONCANONICAL", f"duplicate key {dup!r}")
        raise LineError("NONCANONICAL", "not canonical JSON (key order, whitespace or escapes differ)")
    h = value.get("h")
    if type(h) is not str:
        raise LineError("PARSE", "field 'h' missing or not a string")
    # The line is canonical, so the record without h is the line minus `"h":"…",` at its
    # sorted top-level place. A nested {"h": <this same hash>} earlier in the line would be
    # found first, but a record cannot contain its own hash, so that only ever fails to verify.
    # (A malformed h simply never equals the computed digest: HASH_MISMATCH.)
    marker = b'"h":"' + h.encode("utf-8") + b'",'
    at = raw.find(marker)
    if at < 0:
        raise LineError("PARSE", "field 'h' is not followed by the envelope fields")
    computed = hashlib.sha256(b"\x00" + raw[:at] + raw[at + len(marker) :]).hexdigest()
    return value, computed


def checkpoint_statement(log_id: str, size: int, head: str, root: str, ts_ns: int) -> bytes:
    """The exact bytes a checkpoint signature covers (canonical JSON, domain-separated)."""
    return canonical_bytes(
        {"type": CHECKPOINT_TYPE, "log": log_id, "size": size, "head": head, "root": root, "ts_ns": ts_ns}
    )
