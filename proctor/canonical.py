"""Canonical JSON: one byte string per value, so hashes and signatures are stable.

Sorted keys, compact separators, UTF-8, and no floats: a float is written as its
shortest round-trip decimal string tagged ``{"$float": "12.5"}``, because float
formatting differs between languages and an auditor's verifier must agree with ours
byte for byte. Bytes become ``{"$bytes": base64}``; tuples become lists; sets become
sorted lists. Anything else is refused rather than guessed at.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["canonical_bytes", "canonical_sha256", "jsonable"]


_PLAIN = (str, int, bool, type(None))


def jsonable(value: Any) -> Any:
    """Return `value` as plain JSON types (dict, list, str, int, bool, None), floats tagged."""
    if type(value) is dict and all(type(k) is str and type(v) in _PLAIN for k, v in value.items()):
        return value  # the common case, flat arguments: nothing to convert
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return {"$float": repr(value)}
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"canonical JSON needs string keys, got {type(k).__name__}")
            out[k] = jsonable(v)
        return out
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [jsonable(v) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    raise TypeError(f"cannot put a {type(value).__name__} into canonical JSON")


def canonical_bytes(value: Any) -> bytes:
    """Encode `value` as canonical JSON bytes (see the module docstring)."""
    return json.dumps(
        jsonable(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def canonical_sha256(value: Any) -> str:
    """Hex sha256 of the canonical encoding of `value`."""
    return hashlib.sha256(canonical_bytes(value)).hexdigest()
