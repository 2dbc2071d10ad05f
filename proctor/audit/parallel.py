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
from proctor.audit.records import LineError, parse_line
from proctor.audit.scan import OpenItems, ScanFailure, Scanner

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
    """Check lines in [start, end) of `path`; the chain inside the segment too, but not its first link."""
    path, start, end = task
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    if not data.endswith(b"\n"):
        return _Segment(False)
    lines = data.split(b"\n")
    lines.pop()
    out = _Segment(True, len(lines))
    leaves = bytearray()
    prev_h: str | None = None
    note = out.open.note
    for j, raw in enumerate(lines):
        try:
            rec, computed = parse_line(raw)
        except LineError:
            return _Segment(False)
        h, seq, kind = rec["h"], rec.get("seq"), rec.get("kind")
        if (computed != h or type(seq) is not int or type(rec.get("ts_ns")) is not int
                or type(kind) is not str or kind not in _KINDS):
            return _Segment(False)
        if j == 0:
            out.seq0, out.prev0 = seq, rec.get("prev")
        elif seq != out.seq0 + j or rec.get("prev") != prev_h:
            return _Segment(False)
        if kind == "checkpoint":
            out.checkpoints.append((j, rec))
        else:
            note(kind, rec, seq)
        leaves += bytes.fromhex(h)
        prev_h = h
    out.leaves = bytes(leaves)
    return out


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
    anchors = {a.seq for a in scanner.anchors}
    leaves, frontier = seg.leaves, scanner.frontier
    try:
        for j in range(seg.lines):
            leaf = leaves[32 * j : 32 * j + 32]
            pos = scanner.count
            if j in checkpoints or pos in anchors:
                scanner.head = leaves[32 * j - 32 : 32 * j].hex() if j else scanner.head
                if j in checkpoints:
                    scanner._checkpoint(checkpoints[j], lines_before + j + 1, 0)
                if pos in anchors:
                    scanner._anchors(pos, leaf.hex(), lines_before + j + 1, 0)
            frontier.append(leaf)
            scanner.count = pos + 1
    except ScanFailure:
        return False
    scanner.head = leaves[-32:].hex()
    scanner.open.merge(seg.open)
    return True
