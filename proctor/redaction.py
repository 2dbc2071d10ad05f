"""Keyed redaction of arguments, shared by the audit trail, approvals and spans.

A redacted value is replaced by ``{"$redacted": "hmac-sha256:<hex>"}`` computed with
a per-log key, so two records holding the same card number can still be correlated
by an auditor without the number being written anywhere. A plain hash would not do:
a 16-digit card number is small enough to brute-force from its sha256.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proctor._frozen import quick_init
from proctor.canonical import canonical_bytes

__all__ = ["Redacted", "redact_args"]


@quick_init
@dataclass(frozen=True, slots=True)
class Redacted:
    """Arguments fit to show or store, and a keyed digest of the full, unredacted arguments."""

    args: dict[str, Any]
    digest: str


def _mark(key: bytes, value: Any) -> dict[str, str]:
    return {"$redacted": "hmac-sha256:" + hmac.digest(key, canonical_bytes(value), "sha256").hex()}


def _redact_path(node: Any, path: list[str], key: bytes) -> Any:
    if not isinstance(node, Mapping) or path[0] not in node:
        return node
    out = dict(node)
    head = path[0]
    out[head] = _mark(key, node[head]) if len(path) == 1 else _redact_path(node[head], path[1:], key)
    return out


def redact_args(args: Mapping[str, Any], fields: Sequence[str], key: bytes, *, digest: bool = True) -> Redacted:
    """Redact each field (a name, or a dotted path into nested mappings) of `args`.

    With `digest` false the digest is left empty: it only matters where a record is kept.
    """
    out: dict[str, Any] = dict(args)
    for name in fields:
        out = _redact_path(out, name.split("."), key)
    mac = "hmac-sha256:" + hmac.digest(key, canonical_bytes(args), "sha256").hex() if digest else ""
    return Redacted(args=out, digest=mac)
