"""Keyed redaction of arguments, shared by the audit trail, approvals and spans.

A redacted value is replaced by ``{"$redacted": "hmac-sha256:<hex>"}`` computed with
a per-log key, so two records holding the same card number can still be correlated
by an auditor without the number being written anywhere. A plain hash would not do:
a 16-digit card number is small enough to brute-force from its sha256.

Free text that may quote a redacted value — the program a model wrote, an error message, a
chat transcript — is passed through `scrub` with the clear values the run has seen
(`secret_values`), so the value never reaches a record, a span or a log in clear.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proctor.canonical import canonical_bytes

__all__ = ["MIN_SCRUB_CHARS", "SCRUBBED", "Redacted", "redact_args", "scrub", "secret_values"]


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
    return Redacted(out, mac)


#: Clear values shorter than this are not scrubbed from free text (replacing "1" or "no" would
#: garble programs and messages while hiding nothing: the field itself is always redacted).
MIN_SCRUB_CHARS = 4
SCRUBBED = "[redacted]"


def secret_values(args: Mapping[str, Any], fields: Sequence[str]) -> set[str]:
    """The clear values found at `fields` of `args` (raw or validated), as text to scrub from free text."""
    found: set[str] = set()
    for name in fields:
        node: Any = args
        for part in name.split("."):
            if not isinstance(node, Mapping) or part not in node:
                node = _MISSING
                break
            node = node[part]
        if node is not _MISSING:
            _leaves(node, found)
    return found


_MISSING = object()


def _leaves(node: Any, found: set[str]) -> None:
    if isinstance(node, Mapping):
        for value in node.values():
            _leaves(value, found)
    elif isinstance(node, (list, tuple, set, frozenset)):
        for value in node:
            _leaves(value, found)
    elif node is not None and not isinstance(node, bool):
        text = str(node)
        if len(text) >= MIN_SCRUB_CHARS:
            found.add(text)
            stripped = text.strip()
            if stripped != text and len(stripped) >= MIN_SCRUB_CHARS:
                found.add(stripped)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """`text` with every occurrence of each secret replaced by ``[redacted]`` (longest first)."""
    if not text:
        return text
    for secret in sorted(secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, SCRUBBED)
    return text
