"""Canonical JSON: one byte string per value, so hashes and signatures are stable.

Sorted keys, compact separators, UTF-8, and no floats: a float is written as its
shortest round-trip decimal string tagged ``{"$float": "12.5"}``, because float
formatting differs between languages and an auditor's verifier must agree with ours
byte for byte. Bytes become ``{"$bytes": base64}``; tuples become lists; sets become
sorted lists; subclasses of str and int (enums) become the plain value. Anything else
is refused rather than guessed at.

The definition is CPython's ``json.dumps(sort_keys=True, separators=(",", ":"),
ensure_ascii=False)``. orjson writes the same bytes for plain values about ten times
faster; `ORJSON_AGREES` says whether this orjson does (checked at import), and only
then is it used.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - orjson is a dependency; without it json does all the work
    orjson = None  # type: ignore[assignment]

__all__ = ["ORJSON_AGREES", "canonical_bytes", "canonical_sha256", "is_plain_json", "json_shaped", "jsonable",
           "untagged"]

_PLAIN_LEAVES = frozenset({str, int, bool, type(None)})


def is_plain_json(value: Any) -> bool:
    """Whether `value` holds only exact dicts (with str keys), lists, strs, ints, bools and Nones.

    Iterative, so any depth is fine. Subclasses are refused because encoders read them
    differently (an enum: orjson writes its value, json its int or str).
    """
    if type(value) in _PLAIN_LEAVES:
        return True
    if type(value) is not dict and type(value) is not list:
        return False
    stack: list[Any] = [value]
    leaves = _PLAIN_LEAVES
    while stack:
        item = stack.pop()
        if type(item) is dict:
            for k, v in item.items():
                t = type(v)
                if type(k) is not str:
                    return False
                if t is dict or t is list:
                    stack.append(v)
                elif t not in leaves:
                    return False
        else:
            for v in item:
                t = type(v)
                if t is dict or t is list:
                    stack.append(v)
                elif t not in leaves:
                    return False
    return True


def json_shaped(value: Any) -> Any:
    """`value` as JSON holds it after a round trip: mappings as dicts with string keys, tuples and lists as
    lists, leaves untouched. A record sealed or compared before it is stored then equals itself read back."""
    if isinstance(value, Mapping):
        return {str(k): json_shaped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_shaped(v) for v in value]
    return value


def jsonable(value: Any) -> Any:
    """Return `value` as plain JSON types (exact dict, list, str, int, bool, None), floats tagged."""
    if is_plain_json(value):
        return value  # the common case: nothing to convert
    return _convert(value)


def _convert(value: Any) -> Any:
    if value is None or type(value) is bool:
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return {"$float": repr(value)}
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"canonical JSON needs string keys, got {type(k).__name__}")
            out[str.__str__(k)] = _convert(v)
        return out
    if isinstance(value, (list, tuple)):
        return [_convert(v) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [_convert(v) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    raise TypeError(f"cannot put a {type(value).__name__} into canonical JSON")


def untagged(value: Any) -> Any:
    """`value` read back from canonical JSON with the tags `jsonable` writes undone: ``{"$float": "12.5"}``
    is the float 12.5 and ``{"$bytes": …}`` the bytes again, at any depth; the rest is returned as is (the
    same object where nothing was tagged). Iterative, so any depth is fine.

    A tag is undone only where it is exactly what `jsonable` writes for its value (one key, and the
    value written back gives the same text): anything else is a map like any other. A map holding
    only such a key is written alike whether it was one or the value it tags: canonical JSON cannot
    tell them apart, and this reads the value.
    """
    if not _holds_tag(value):
        return value
    root: list[Any] = [value]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:
        container, key = stack.pop()
        item = container[key]
        if type(item) is dict:
            found = _untag(item) if len(item) == 1 else _NOT_TAGGED
            if found is not _NOT_TAGGED:
                container[key] = found
                continue
            copy = container[key] = dict(item)
            stack.extend((copy, k) for k, v in copy.items() if type(v) is dict or type(v) is list)
        elif type(item) is list:
            items = container[key] = list(item)
            stack.extend((items, i) for i, v in enumerate(items) if type(v) is dict or type(v) is list)
    return root[0]


def _holds_tag(value: Any) -> bool:
    """Whether `value` holds a map `untagged` reads back as a float or bytes, at any depth."""
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is dict:
            if len(item) == 1 and _untag(item) is not _NOT_TAGGED:
                return True
            stack.extend(v for v in item.values() if type(v) is dict or type(v) is list)
        elif type(item) is list:
            stack.extend(v for v in item if type(v) is dict or type(v) is list)
    return False


_NOT_TAGGED: Any = object()


def _untag(value: dict[str, Any]) -> Any:
    """The value a one-key tagged map stands for, or `_NOT_TAGGED`."""
    text = value.get("$float")
    if type(text) is str:
        try:
            number = float(text)
        except ValueError:
            return _NOT_TAGGED
        return number if repr(number) == text else _NOT_TAGGED
    text = value.get("$bytes")
    if type(text) is str:
        try:
            raw = base64.b64decode(text, validate=True)
        except ValueError:
            return _NOT_TAGGED
        return raw if base64.b64encode(raw).decode("ascii") == text else _NOT_TAGGED
    return _NOT_TAGGED


def _json_bytes(plain: Any) -> bytes:
    text = json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("canonical JSON cannot hold a lone surrogate (text that is not valid Unicode)") from None


def canonical_bytes(value: Any) -> bytes:
    """Encode `value` as canonical JSON bytes (see the module docstring)."""
    plain = jsonable(value)
    if ORJSON_AGREES:
        try:
            return orjson.dumps(plain, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # orjson's JSONEncodeError: ints beyond 64 bits, lone surrogates, deep nesting
            pass
    return _json_bytes(plain)


def canonical_sha256(value: Any) -> str:
    """Hex sha256 of the canonical encoding of `value`."""
    return hashlib.sha256(canonical_bytes(value)).hexdigest()


# Code points where JSON encoders are known to disagree (escapes for DEL, C1 controls,
# U+2028/2029, BOM, noncharacters, astral planes) and every ASCII character.
_PROBE_CHARS = [chr(c) for c in range(0x80)] + [
    "\x80", "\x9f", "\xa0", "\xad", "\u061c", "\u2028", "\u2029", "\ud7ff", "\ue000", "\ufeff",
    "\ufffe", "\uffff", "\U00010000", "\U0001f600", "\U0010ffff", "é", "日本",
]


def _orjson_agrees() -> bool:
    r"""Whether this orjson encodes plain values exactly as json does (see the module docstring).

    Both write plain values the same way: compact separators, ``true``/``false``/``null``,
    integers in decimal, keys sorted by code point, and strings escaped one character at
    a time (``\"``, ``\\``, ``\b\f\n\r\t``, other controls below U+0020 as lowercase
    ``\u00XX``, everything else as raw UTF-8). tests/audit checks the per-character
    agreement for every code point; this probe re-checks, at import, the characters
    where JSON libraries are known to differ, key order and the integer range, so an
    orjson release that behaves differently turns the fast path off instead of changing
    a hash.
    """
    if orjson is None:  # pragma: no cover
        return False
    keys = ["", "a", "B", "aa", "\x7f", "\x80", "\ud7ff", "\ue000", "\uffff", "\U00010000", "\U0010ffff"]
    probe = {
        "chars": _PROBE_CHARS,
        "ints": [0, -1, 1, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1],
        "keys": {k: [True, False, None, {}, []] for k in reversed(keys)},
    }
    try:
        fast = orjson.dumps(probe, option=orjson.OPT_SORT_KEYS)
        return fast == _json_bytes(probe) and orjson.loads(fast) == probe and json.loads(fast) == probe
    except (ValueError, TypeError):  # pragma: no cover
        return False


#: True when orjson is installed and writes plain values byte for byte as json does.
ORJSON_AGREES = _orjson_agrees()
