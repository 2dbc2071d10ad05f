"""Shared builders for the audit tests: signed logs of a given size, and record surgery."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from proctor.audit import AuditLog
from proctor.audit.records import checkpoint_statement, seal

#: A periodic checkpoint is written before every 4th non-checkpoint record.
EVERY = 3


@functools.lru_cache(maxsize=1)
def signing_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(bytes(range(32)))


@functools.lru_cache(maxsize=1)
def other_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33)))


def write_log(path: Path, n: int, *, key: Ed25519PrivateKey | None = None, every: int = EVERY) -> None:
    """A closed log of `n` step records (plus periodic and closing checkpoints)."""
    with AuditLog(path, signing_key=key or signing_key(), durability="flush", checkpoint_every=every) as log:
        for i in range(n):
            assert log.append("step", {"run_id": "run_1", "step": i, "note": f"record {i}"}).ok


_CACHE: dict[tuple[int, int], tuple[bytes, bytes]] = {}


def built(tmp: Path, n: int, every: int = EVERY) -> tuple[bytes, bytes]:
    """(log bytes, side file bytes) of a signed log of `n` records, built once per session."""
    if (n, every) not in _CACHE:
        path = tmp / f"template-{n}-{every}.jsonl"
        write_log(path, n, every=every)
        _CACHE[(n, every)] = (path.read_bytes(), Path(str(path) + ".checkpoint").read_bytes())
    return _CACHE[(n, every)]


def lines_of(data: bytes) -> list[bytes]:
    """The lines of a log, each with its newline."""
    return data.splitlines(keepends=True)


def rec(line: bytes) -> dict[str, Any]:
    value = json.loads(line)
    assert isinstance(value, dict)
    return value


def reseal(record: dict[str, Any]) -> bytes:
    """A record line with `h` recomputed (what an attacker who edits a record does)."""
    body = {k: v for k, v in record.items() if k != "h"}
    line, _ = seal(body)
    return line


def resign(record: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """A checkpoint record re-signed by `key` over its (possibly edited) fields."""
    out = dict(record)
    statement = checkpoint_statement(out["log"], out["size"], out["head"], out["root"], out["ts_ns"],
                                     closed=out.get("closed") is True, reopened=out.get("reopened") is True)
    out["sig"] = key.sign(statement).hex()
    return out


def bump_ts(record: dict[str, Any]) -> dict[str, Any]:
    out = dict(record)
    out["ts_ns"] = out["ts_ns"] + 1
    return out


def rechain(lines: list[bytes], start: int) -> list[bytes]:
    """Recompute `prev` and `h` of every record from `start` on (checkpoint fields untouched)."""
    out = list(lines)
    for j in range(start, len(out)):
        r = rec(out[j])
        r["prev"] = rec(out[j - 1])["h"] if j else "0" * 64
        out[j] = reseal(r)
    return out


def checkpoint_positions(lines: list[bytes]) -> list[int]:
    return [i for i, line in enumerate(lines) if rec(line)["kind"] == "checkpoint"]


def offset_of(lines: list[bytes], i: int) -> int:
    return sum(len(line) for line in lines[:i])
