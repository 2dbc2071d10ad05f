"""Verify large logs in parallel: worker processes check segments, the parent stitches them.

Almost all of verification is per line (parse, canonical re-encode, hash) and needs
no state, so worker processes check contiguous segments of the file and send back
what the chain needs: the segment's first seq and prev, its leaf hashes (32 bytes a
record), its checkpoint records, and its net effect on what the log leaves open
(`scan.OpenItems`: intents, runs, approvals, recoveries). The parent
then checks the joins between segments, every checkpoint (signature, size, head,
Merkle root — it owns the frontier) and the anchors, in file order.

This is a fast path for intact logs only: on *any* problem it returns None and the
caller re-runs the sequential scan, which is the reference and produces the exact
report (first failure, line, offset). So the parallel path can never change an
answer; it can only make a good log verify sooner.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from proctor.audit.base import KINDS
from proctor.audit.lines import MAX_LINE_BYTES
from proctor.audit.records import BATCH, ORJSON_FAST, LineError, check_batch, parse_line
from proctor.audit.scan import OpenItems, ScanFailure, Scanner

try:
    import orjson
except ImportError:  # pragma: no cover - then ORJSON_FAST is False and lines are checked one by one
    orjson = None  # type: ignore[assignment]

__all__ = ["scan_parallel"]

_KINDS = frozenset(KINDS)


@dataclass
class _Segment:
    ok: bool
    lines: int = 0
    seq0: Any = None
    prev0: Any = None
    leaves: bytes = b""
    checkpoints: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    open: OpenItems = field(default_factory=lambda: OpenItems(segment=True))


def _check_segment(task: tuple[str, int, int]) -> _Segment:
    """Check lines in [start, end) of `path`; the chain inside the segment too, but not its first link.

    Batches of lines go through `records.check_batch` (the sequential scan's fast path, which
    lets checkpoints through here: the parent checks them); a batch it does not accept is
    checked line by line, and any line that fails makes the whole segment fail.
    """
    path, start, end = task
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    if not data.endswith(b"\n"):
        return _Segment(False)
    lines = data.split(b"\n")
    lines.pop()
    out = _Segment(True, len(lines))
    if not lines:
        return out
    try:
        first = orjson.loads(lines[0]) if orjson is not None else None
    except ValueError:
        first = None
    seq0, prev0 = (first.get("seq"), first.get("prev")) if type(first) is dict else (None, None)
    out.seq0, out.prev0 = seq0, prev0  # if orjson cannot read the first line, _check_each sets them
    leaves = bytearray()
    head = prev0
    note_many = out.open.note_many
    for j in range(0, len(lines), BATCH):
        batch = lines[j : j + BATCH]
        checked = (check_batch(batch, seq0 + j, head, _KINDS)
                   if ORJSON_FAST and type(seq0) is int and type(head) is str else None)
        if checked is None:
            if not _check_each(out, batch, j, head, leaves):
                return _Segment(False)
            head = leaves[-32:].hex()
        else:
            recs, kinds, seqs, hs, batch_leaves = checked
            out.checkpoints += [(j + i, rec) for i, rec in enumerate(recs) if kinds[i] == "checkpoint"]
            note_many(kinds, recs, seqs)
            leaves += b"".join(batch_leaves)
            head = hs[-1]
    out.leaves = bytes(leaves)
    return out


def _check_each(out: _Segment, lines: list[bytes], j0: int, head: Any, leaves: bytearray) -> bool:
    """`_check_segment` one line at a time (lines `j0`, … of the segment); False at the first bad line."""
    note = out.open.note
    for j, raw in enumerate(lines, j0):
        try:
            rec, computed = parse_line(raw)
        except LineError:
            return False
        h, seq, kind = rec["h"], rec.get("seq"), rec.get("kind")
        if (computed != h or type(seq) is not int or type(rec.get("ts_ns")) is not int
                or type(kind) is not str or kind not in _KINDS):
            return False
        if j == 0:
            out.seq0, out.prev0 = seq, rec.get("prev")
        elif seq != out.seq0 + j or rec.get("prev") != head:
            return False
        if kind == "checkpoint":
            out.checkpoints.append((j, rec))
        else:
            note(kind, rec, seq)
        leaves += bytes.fromhex(h)
        head = h
    return True


def _segments(path: str, size: int, count: int) -> list[tuple[str, int, int]] | None:
    """About `count` byte ranges of `path`, each ending just after a newline; None if a line
    is over the line limit (the sequential scan reports it, reading no more than the limit)."""
    bounds = [0]
    with open(path, "rb") as f:
        for k in range(1, count):
            f.seek(max(size * k // count, bounds[-1]))
            if not f.readline(MAX_LINE_BYTES + 1).endswith(b"\n") and f.tell() < size:
                return None
            pos = f.tell()
            if pos >= size:
                break
            if pos > bounds[-1]:
                bounds.append(pos)
    bounds.append(size)
    return [(path, a, b) for a, b in itertools.pairwise(bounds) if b > a]


def scan_parallel(path: str, scanner: Scanner, workers: int,
                  progress: Callable[[int], None] | None = None) -> int | None:
    """Scan `path` into `scanner` with `workers` processes; the line count, or None to fall back to sequential.

    `progress` is called with the bytes checked so far as each segment is stitched.
    """
    size = os.path.getsize(path)
    # Segments of at most about 64 MiB (plus a line), so no worker holds more than that.
    tasks = _segments(path, size, max(workers * 4, size >> 26))
    if tasks is None:
        return None
    # fork is cheap, but forking a process that runs other threads can deadlock the child.
    method = "fork" if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method)) as pool:
        lines = 0
        for (_, _, end), seg in zip(tasks, pool.map(_check_segment, tasks), strict=True):
            if not seg.ok or not _stitch(scanner, seg, lines):
                return None
            lines += seg.lines
            if progress is not None:
                progress(end)
    return lines


def _stitch(scanner: Scanner, seg: _Segment, lines_before: int) -> bool:
    if seg.lines == 0:
        return True
    if seg.seq0 != scanner.count or seg.prev0 != scanner.head:
        return False
    checkpoints = dict(seg.checkpoints)
    seq0, leaves, frontier = scanner.count, seg.leaves, scanner.frontier
    # Records a checkpoint or an anchor is about need the state just before them; the runs
    # of leaves between them go into the frontier in bulk.
    stops = sorted(checkpoints.keys() | {a.seq - seq0 for a in scanner.anchors if 0 <= a.seq - seq0 < seg.lines})
    done = 0
    try:
        for j in stops:
            frontier.extend([leaves[i : i + 32] for i in range(32 * done, 32 * j, 32)])
            pos = scanner.count = seq0 + j
            scanner.head = leaves[32 * j - 32 : 32 * j].hex() if j else scanner.head
            if j in checkpoints:
                scanner.check_checkpoint(checkpoints[j], lines_before + j + 1, 0)
            if pos in scanner.anchor_seqs:
                scanner.check_anchors(pos, leaves[32 * j : 32 * j + 32].hex(), lines_before + j + 1, 0)
            frontier.append(leaves[32 * j : 32 * j + 32])
            done = j + 1
        frontier.extend([leaves[i : i + 32] for i in range(32 * done, len(leaves), 32)])
    except ScanFailure:
        return False
    scanner.count = seq0 + seg.lines
    scanner.head = leaves[-32:].hex()
    scanner.open.merge(seg.open)
    return True
