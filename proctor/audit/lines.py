"""The one line-length limit of audit logs, and a line reader that holds it.

No record `AuditLog` writes is longer than `MAX_LINE_BYTES` (it refuses such a record
instead), so every reader — `verify`, reopening a log, `audit show` and `tail` — may
refuse a longer line without reading it whole: memory stays bounded by the limit
whatever the file holds (a 300 MB line costs 16 MiB, not 300 MB).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

__all__ = ["MAX_LINE_BYTES", "LongLine", "iter_line_batches", "iter_lines", "read_records", "too_long_message"]

#: The longest record line (without its newline) a log may hold: 16 MiB.
MAX_LINE_BYTES = 16 << 20
_SKIP = 1 << 20
#: What `iter_line_batches` reads at a time.
_CHUNK = 1 << 20


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


def iter_line_batches(f: BinaryIO, limit: int = MAX_LINE_BYTES, chunk: int = _CHUNK
                      ) -> Iterator[Sequence[bytes | LongLine]]:
    """The lines `iter_lines(f, limit)` yields, in the same order, a batch per read of `chunk` bytes.

    For readers of a whole log (`policy replay`): one read and one split per megabyte instead of
    a `readline` and a generator step per line. The limit holds the same way: a line over `limit`
    bytes is never held whole (memory stays under `limit` + `chunk`); it is skipped and yielded
    as a `LongLine` with its offset and length.
    """
    offset = f.tell()  # of the first byte of `data`
    data = b""
    skipping: tuple[int, int] | None = None  # (offset, length so far) of a line over the limit
    while True:
        more = f.read(chunk)
        if skipping is not None:
            start, length = skipping
            end = more.find(b"\n")
            if end < 0:
                if not more:
                    yield [LongLine(start, length)]
                    return
                skipping = (start, length + len(more))
                continue
            yield [LongLine(start, length + end)]
            skipping, offset, more = None, start + length + end + 1, more[end + 1:]
            if not more:
                continue
        elif not more:
            if data:  # the last line, without a newline (never over the limit: see below)
                yield [data]
            return
        data = data + more if data else more
        lines = data.split(b"\n")
        rest = lines.pop()  # the line the next read continues (b"" after a newline)
        if lines:
            if max(map(len, lines)) <= limit:
                yield lines
            else:
                batch: list[bytes | LongLine] = []
                at = offset
                for line in lines:
                    batch.append(LongLine(at, len(line)) if len(line) > limit else line)
                    at += len(line) + 1
                yield batch
        offset += len(data) - len(rest)
        if len(rest) > limit:  # over the limit before its end: not kept
            skipping, data = (offset, len(rest)), b""
        else:
            data = rest


def read_records(path: str | os.PathLike[str], *, containing: bytes | None = None,
                 broken: list[str] | None = None) -> tuple[list[dict[str, Any]], int]:
    """Every readable record of the log at `path`, and how many lines were not one (over the limit,
    not JSON, not an object): counted, not fatal, for readers that show a log (`verify` judges it).

    With `containing`, only lines holding those bytes are parsed (one run's records of a big log
    without decoding the rest); the caller still checks the field it wants. With `broken` as well,
    each such line is also checked where it stands in the hash chain — canonical, matching its
    own ``h``, linked to the line before it and from the line after it — and what does not hold
    is described there (a record edited, inserted or appended by hand); `verify` checks the rest.
    """
    records: list[dict[str, Any]] = []
    bad = 0
    check = containing is not None and broken is not None
    before: bytes | None = None  # the line before this one (raw), for its h
    linked: tuple[int, str] | None = None  # (line number, h) of the last line read, for the next line's prev
    number = 0
    with open(path, "rb") as f:
        for raw in iter_lines(f):  # a line over the limit is never read whole
            number += 1
            if not isinstance(raw, bytes):
                bad += 1
                before = linked = None
                continue
            if check and linked is not None:
                if _field(raw, "prev") != linked[1]:
                    cast(list[str], broken).append(f"line {linked[0]}: the line after it does not link to it")
                linked = None
            if containing is not None and containing not in raw:
                before = raw
                continue
            if check:
                linked = _check_link(raw, before, number, cast(list[str], broken))
                before = raw
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


def _field(raw: bytes, name: str) -> Any:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return value.get(name) if isinstance(value, dict) else None


def _check_link(raw: bytes, before: bytes | None, number: int, broken: list[str]) -> tuple[int, str] | None:
    """Check one line where it stands in the chain; return (number, h) for the next line's check."""
    from proctor.audit.records import LineError, parse_line

    try:
        value, computed = parse_line(raw)
    except LineError as exc:
        broken.append(f"line {number}: {exc}")
        return None
    h = value.get("h")
    if h != computed:
        broken.append(f"line {number}: the record does not match its hash")
    if before is not None and value.get("prev") != _field(before, "h"):
        broken.append(f"line {number}: the record does not link to the line before it")
    return (number, h) if isinstance(h, str) else None
