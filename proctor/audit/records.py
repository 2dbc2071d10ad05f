"""The record format: envelope fields, sealing a record, and parsing one line strictly.

A record is one line of canonical JSON (`proctor.canonical`: sorted keys, compact
separators, UTF-8, no floats) ending in ``\\n``. The envelope is ``seq`` (0-based, the
record's index and its Merkle leaf index), ``ts_ns``, ``kind``, ``prev`` (the previous
record's ``h``; `GENESIS` for the first) and ``h = sha256(0x00 ‖ canonical record
without h)``, which is also the record's RFC 6962 leaf hash.

Parsing is the verifier's hot path. The exact check is CPython's `json`: one C scan,
one C re-encode compared byte for byte (which also catches duplicate keys, whitespace
and escapes), one hash. When orjson is installed, a line is first tried on a fast path
that can only ever *accept* (see `parse_line`); everything it does not accept goes to
the exact check, so verdicts and messages never depend on orjson.
"""

from __future__ import annotations

import hashlib
import json
import json.encoder
from collections.abc import Callable, Mapping
from itertools import repeat
from operator import itemgetter
from typing import Any, TypeGuard

from proctor.audit.base import KINDS
from proctor.canonical import ORJSON_AGREES, canonical_bytes, jsonable
from proctor.errors import LineError

try:
    import orjson
except ImportError:  # pragma: no cover - orjson is a dependency; without it only the exact path runs
    orjson = None  # type: ignore[assignment]

__all__ = [
    "APPENDABLE_KINDS",
    "BATCH",
    "CALL_STATUSES",
    "CHECKPOINT_TYPE",
    "CODES",
    "ENVELOPE",
    "GENESIS",
    "LineError",
    "append_problem",
    "check_batch",
    "checkpoint_statement",
    "duplicate_key",
    "is_hex64",
    "parse_line",
    "parse_record",
    "seal",
    "seal_owned",
]

#: `prev` of the first record.
GENESIS = "0" * 64
#: Fields the log writes itself; callers may not supply them.
ENVELOPE = ("seq", "ts_ns", "kind", "prev", "h")
#: `status` values of a `call_outcome` record.
CALL_STATUSES = ("ok", "failed", "denied", "timeout", "unknown", "cancelled")
#: The kinds a caller may append: every kind but those a log writes itself.
APPENDABLE_KINDS = tuple(k for k in KINDS if k not in ("checkpoint", "recovery"))
_APPENDABLE = frozenset(APPENDABLE_KINDS)
_ENVELOPE_SET = frozenset(ENVELOPE)


def append_problem(kind: str, fields: Mapping[str, Any]) -> str | None:
    """Why a record of `kind` with `fields` may not be appended to any audit sink, or None.

    One rule for every sink (the file log, PostgreSQL), so they refuse the same records.
    """
    if kind not in _APPENDABLE:
        return f"kind {kind!r} cannot be appended (allowed: {', '.join(APPENDABLE_KINDS)})"
    if not _ENVELOPE_SET.isdisjoint(fields):
        reserved = [name for name in ENVELOPE if name in fields]
        return f"field(s) {', '.join(reserved)} are written by the log itself"
    if kind in ("call_intent", "call_outcome") and not isinstance(fields.get("call_id"), str):
        return f"a {kind} record needs a string call_id"
    if kind == "call_outcome" and fields.get("status") not in CALL_STATUSES:
        return f"call_outcome status must be one of {', '.join(CALL_STATUSES)}, not {fields.get('status')!r}"
    return None
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
    "AFTER_CLOSE",
)

_HEX = frozenset("0123456789abcdef")
_sha256 = hashlib.sha256


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
    conversion to plain JSON types runs once, because this is on every append's path.
    orjson encodes it when it agrees with json (`proctor.canonical.ORJSON_AGREES`);
    anything orjson refuses (ints beyond 64 bits, lone surrogates, nesting over 254
    levels) takes the json encoder.
    """
    line, h, _ = seal_owned(dict(record))
    return line, h


def seal_owned(record: dict[str, Any]) -> tuple[bytes, str, bytes]:
    """`seal` of a dict the caller owns (it may be changed): (line, h, and h as 32 raw bytes: the Merkle leaf).

    The log's append path: no copy of a record that holds plain JSON types already, and the
    leaf comes from the same digest instead of being parsed back from its hex.
    """
    plain = jsonable(record)  # the record itself when it holds plain JSON types: see `proctor.canonical.jsonable`
    if _FAST:
        try:
            body = _odumps(plain, None, _OSORT)
        except TypeError:  # orjson's JSONEncodeError
            pass
        else:
            leaf = _sha256(b"\x00" + body).digest()
            h = plain["h"] = leaf.hex()
            return _odumps(plain, None, _OSORT | _ONEWLINE), h, leaf
    line, h = _seal_json(plain)
    return line, h, bytes.fromhex(h)


def _seal_json(plain: dict[str, Any]) -> tuple[bytes, str]:
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
    value, leaf = parse_record(raw)
    return value, leaf.hex()


def parse_record(raw: bytes) -> tuple[dict[str, Any], bytes]:
    """`parse_line` with the computed leaf hash as 32 raw bytes (what the Merkle tree takes).

    Fast path: orjson parses the line and re-encodes it with sorted keys; if that gives
    back exactly `raw` and the record holds no float, the line is canonical (why: see
    `proctor.canonical.ORJSON_AGREES`), and `h` is hashed over the line with its ``"h":"…",`` cut out.
    Any other outcome — orjson refusing the line (invalid JSON or UTF-8, lone
    surrogates, nesting too deep), different bytes (duplicate keys, whitespace, escapes,
    key order, CRLF, ints beyond 64 bits that orjson reads as floats) or a float —
    proves nothing, and CPython's json decides (`_parse_exact`), so every verdict and
    message is the one it gives. The fast path can accept a line, never reject one.
    """
    if _FAST:
        try:
            value = _oloads(raw)
            same = type(value) is dict and _odumps(value, option=_OSORT) == raw
        except (ValueError, TypeError):  # orjson's decode and encode errors
            same = False
        if same and not (may_hold_float(raw) and holds_float(value)):
            h = value.get("h")
            at = raw.find(b'"h":"')
            if type(h) is str and at >= 0:
                hb = h.encode("utf-8")
                end = at + 5 + len(hb)
                # The first `"h":"` followed by this h and `",` is the first full marker, as `_leaf` finds it.
                if raw.startswith(hb, at + 5) and raw.startswith(b'",', end):
                    return value, _sha256(b"\x00" + raw[:at] + raw[end + 2 :]).digest()
            return _leaf(raw, value)
    return _parse_exact(raw)


def _parse_exact(raw: bytes) -> tuple[dict[str, Any], bytes]:
    """`parse_line` with CPython's json only: the reference every verdict comes from."""
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
    return _leaf(raw, value)


def _leaf(raw: bytes, value: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """(record, computed leaf hash) for a line already known to be canonical JSON of `value`."""
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
    return value, _sha256(b"\x00" + raw[:at] + raw[at + len(marker) :]).digest()


def may_hold_float(raw: bytes) -> bool:
    """Whether orjson's encoding `raw` may hold a float: a digit before ".", or before "e+"/"e-".

    orjson writes every float with a fraction or a signed exponent (`_floats_marked`
    checks at import; if it did not, this always says yes), so a line with neither
    cannot hold one and the exact walk (`holds_float`) is skipped. Mostly this is a few
    memchr calls: "." in an e-mail address or "-" in a date seldom follows a digit.
    """
    if not _FLOAT_MARKED:  # pragma: no cover - an orjson writing floats some other way
        return True
    find = raw.find
    i = find(b".")
    while i > 0:
        if 48 <= raw[i - 1] <= 57:
            return True
        i = find(b".", i + 1)
    for sign in (b"-", b"+"):
        i = find(sign)
        while i > 1:
            if raw[i - 1] == 101 and 48 <= raw[i - 2] <= 57:  # <digit>e
                return True
            i = find(sign, i + 1)
    return False


def holds_float(obj: dict[str, Any]) -> bool:
    """Whether a parsed record holds a float anywhere (the exact check; records hold integers only)."""
    for v in obj.values():
        t = type(v)
        if t is float or (t is dict and holds_float(v)) or (t is list and _has_float_list(v)):
            return True
    return False


def _has_float_list(items: list[Any]) -> bool:
    for v in items:
        t = type(v)
        if t is float or (t is dict and holds_float(v)) or (t is list and _has_float_list(v)):
            return True
    return False


# Floats of every shape orjson writes: integral, tiny, huge, subnormal, negative.
_FLOAT_PROBE = [0.0, -0.0, 1.0, -2.5, 0.1, 1e-5, 1e-7, 5e-324, 2.0**64, 1e15, 1e16, 1e21, 1e22, 1e300, -1e-300,
                1.7976931348623157e308]


def _floats_marked() -> bool:
    """Whether orjson writes every float with ".", "e+" or "e-": then a line without those holds no float."""
    if orjson is None:  # pragma: no cover
        return False
    return all(any(c in orjson.dumps(f) for c in (b".", b"e+", b"e-")) for f in _FLOAT_PROBE)


#: True when orjson is installed and encodes like `canonical_bytes`: lines may take the fast path.
ORJSON_FAST = _FAST = ORJSON_AGREES
_FLOAT_MARKED = _floats_marked()
if orjson is not None:
    _oloads = orjson.loads
    _odumps = orjson.dumps
    _OSORT = orjson.OPT_SORT_KEYS
    _ONEWLINE = orjson.OPT_APPEND_NEWLINE


def checkpoint_statement(log_id: str, size: int, head: str, root: str, ts_ns: int, *,
                         closed: bool = False, reopened: bool = False) -> bytes:
    """The exact bytes a checkpoint signature covers (canonical JSON, domain-separated).

    `closed` marks the checkpoint a writer seals the log with when it closes it, `reopened`
    the one a writer starts with when it appends to a closed log again: signed, they let
    `verify` tell records appended after a close by someone without the key. Each key is in
    the statement only when true, so every checkpoint written before them verifies as it did.
    """
    statement: dict[str, Any] = {"type": CHECKPOINT_TYPE, "log": log_id, "size": size, "head": head, "root": root,
                                 "ts_ns": ts_ns}
    if closed:
        statement["closed"] = True
    if reopened:
        statement["reopened"] = True
    return canonical_bytes(statement)


#: Lines checked together by `check_batch` (the scanner's fast path, sequential or parallel): enough to
#: spread its fixed costs, few enough that the records stay in cache and a batch that falls back costs little.
BATCH = 32
_get_h, _get_seq, _get_ts = itemgetter("h"), itemgetter("seq"), itemgetter("ts_ns")
_get_kind, _get_prev = itemgetter("kind"), itemgetter("prev")


def check_batch(
    lines: list[bytes], count: int, head: str, kinds_ok: frozenset[str]
) -> tuple[list[dict[str, Any]], list[str], list[int], list[str], list[bytes]] | None:
    """Each line's checks in `Scanner.feed` for a whole batch, or None if any line might fail one.

    Lines must be canonical records without floats whose `h` is their hash, with seqs
    `count`, `count + 1`, … and each `prev` the `h` before it (`head` for the first), an
    integer `ts_ns` and a kind in `kinds_ok`. Returns (records, kinds, seqs, hs, leaves).
    Each test is one C-level pass over the batch. The canonical test compares orjson's
    encoding of the list of records with the lines joined: each line parsed on its own
    into an object, and an object's encoding ends at its matching brace, so equal joins
    mean each line equals its encoding.
    """
    try:
        recs = list(map(orjson.loads, lines))
        joined = b",".join(lines)
        out = orjson.dumps(recs, None, orjson.OPT_SORT_KEYS)
        if (len(out) != len(joined) + 2 or not out.startswith(joined, 1) or out[0] != 91  # "[" + joined + "]"
                or set(map(type, recs)) != {dict}):
            return None
        # The lines are joined by "," between "}" and "{": no float can straddle a join.
        if may_hold_float(joined) and any(map(holds_float, recs)):
            return None
        hs = list(map(_get_h, recs))
        if set(map(type, hs)) != {str}:
            return None
        # The first `"h":"` of each line must start `"h":"<h>",` (where `records._leaf` cuts).
        markers = list(map(b'"h":"%b",'.__mod__, map(str.encode, hs)))
        ats = list(map(bytes.find, lines, repeat(b'"h":"')))
        if not all(map(bytes.startswith, lines, markers, ats)):
            return None
        sha = hashlib.sha256
        leaves = [sha(b"\x00" + raw[:at] + raw[at + len(m) :]).digest()
                  for raw, at, m in zip(lines, ats, markers, strict=True)]
        k = len(lines)
        seqs = list(map(_get_seq, recs))
        kinds = list(map(_get_kind, recs))
        if (list(map(bytes.hex, leaves)) != hs
                or seqs != list(range(count, count + k)) or set(map(type, seqs)) != {int}
                or set(map(type, map(_get_ts, recs))) != {int}
                or not kinds_ok.issuperset(kinds)  # only strs are in it; an unhashable kind raises
                or list(map(_get_prev, recs)) != [head, *hs[:-1]]):
            return None
    except (ValueError, TypeError, KeyError):  # orjson's errors, a missing field, an unhashable kind
        return None
    return recs, kinds, seqs, hs, leaves
