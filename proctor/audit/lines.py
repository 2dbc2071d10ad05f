"""The one line-length limit of audit logs, and a line reader that holds it.

No record `AuditLog` writes is longer than `MAX_LINE_BYTES` (it refuses such a record
instead), so every reader — `verify`, reopening a log, `audit show` and `tail` — may
refuse a longer line without reading it whole: memory stays bounded by the limit
whatever the file holds (a 300 MB line costs 16 MiB, not 300 MB).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

__all__ = ["MAX_LINE_BYTES", "LongLine", "iter_lines", "read_records", "too_long_message"]

#: The longest record line (without its newline) a log may hold: 16 MiB.
MAX_LINE_BYTES = 16 << 20
_SKIP = 1 << 20


@dataclass(frozen=True, slots=True)
class LongLine:
    """A line over the limit, skipped without being kept: where it starts and how long it is."""

    offset: int
    length: int


def too_long_message(limit: int = MAX_LINE_BYTES) -> str:
    """How readers describe a line over `limit` bytes."""
    return (f"line longer than the {limit}-byte line limit; AuditLog never writes one, "
            "so the file is corrupt or not an audit log")


def iter_lines(f: BinaryIO, limit: int = MAX_LINE_BYTES) -> Iterator[bytes | LongLine]:
    """Yield the lines of `f` (without newlines; a last line without one too); a line over
    `limit` bytes is skipped in 1 MiB reads and yielded as a `LongLine`."""
    offset = f.tell()
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        if line.endswith(b"\n"):
            offset += len(line)
            yield line[:-1]
            continue
        if len(line) <= limit:  # the last line, without a newline
            offset += len(line)
            yield line
            continue
        start, length = offset, len(line)
        while True:
            chunk = f.readline(_SKIP)
            length += len(chunk)
            if not chunk or chunk.endswith(b"\n"):
                break
        offset += length
        yield LongLine(start, length - 1 if chunk.endswith(b"\n") else length)


def read_records(path: str | os.PathLike[str], *, containing: bytes | None = None
                 ) -> tuple[list[dict[str, Any]], int]:
    """Every readable record of the log at `path`, and how many lines were not one (over the limit,
    not JSON, not an object): counted, not fatal, for readers that show a log (`verify` judges it).

    With `containing`, only lines holding those bytes are parsed (one run's records of a big log
    without decoding the rest); the caller still checks the field it wants.
    """
    records: list[dict[str, Any]] = []
    bad = 0
    with open(path, "rb") as f:
        for raw in iter_lines(f):  # a line over the limit is never read whole
            if not isinstance(raw, bytes):
                bad += 1
                continue
            if containing is not None and containing not in raw:
                continue
            try:
                value = json.loads(raw)
            except (ValueError, RecursionError):
                bad += 1
                continue
            if isinstance(value, dict):
                records.append(value)
            else:
                bad += 1
    return records, bad
