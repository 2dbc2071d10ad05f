"""Verify an audit log end to end, streaming, and report the first failure.

```python
from proctor.audit.verify import verify
report = verify("audit.jsonl", pubkey="audit.key.pub", trusted_checkpoint="saved.checkpoint")
report.ok, report.failure.code, report.failure.seq, report.failure.line, report.failure.offset
```

What each check catches is listed in docs/audit.md; in short: a changed byte is a
PARSE, NONCANONICAL or HASH_MISMATCH at that record; a deleted, duplicated, swapped
or inserted record is a SEQ_GAP (or PREV_MISMATCH) where the order breaks; a record
changed and every later `h`/`prev` recomputed is caught by the next signed
checkpoint (CKPT_ROOT, or CKPT_SIG if the checkpoint was edited too); a cut tail is
caught by the side file or a trusted checkpoint (ROLLBACK); a different history of
the same length by a trusted checkpoint (FORK).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from io import BytesIO
from itertools import repeat
from pathlib import Path
from typing import Any, Literal

from proctor.audit.keys import PublicKeySource, load_public_key
from proctor.audit.lines import MAX_LINE_BYTES, too_long_message
from proctor.audit.records import BATCH, ORJSON_FAST, check_batch
from proctor.audit.scan import PLAIN_KINDS, Anchor, Failure, ScanFailure, Scanner, load_anchor
from proctor.errors import AuditError

try:
    import orjson
except ImportError:  # pragma: no cover - then ORJSON_FAST is False and lines are fed one by one
    orjson = None  # type: ignore[assignment]

__all__ = [
    "Failure", "VerifyReport", "auto_workers", "check_batch", "feed_lines", "scan_file", "side_file_path", "verify",
]

_CHUNK = 1 << 20
_PARALLEL_MIN = 8 << 20  # below this, starting worker processes costs more than it saves
#: Past this many processes the parent's stitching (about 1 M records/s) is the limit.
_MAX_AUTO_WORKERS = 8


def auto_workers() -> int:
    """What ``workers="auto"`` means: the CPUs this process may run on, at most 8."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        usable = os.cpu_count() or 1
    return max(1, min(usable, _MAX_AUTO_WORKERS))


def side_file_path(log: str | os.PathLike[str]) -> Path:
    """Where `AuditLog` keeps the latest checkpoint of `log`."""
    return Path(os.fspath(log) + ".checkpoint")


@dataclass
class VerifyReport:
    """What `verify` found. `ok` is False exactly when `failure` is set."""

    path: str
    ok: bool
    records: int
    bytes: int
    checkpoints: int = 0
    signed_checkpoints: int = 0
    last_checkpoint_seq: int | None = None
    head: str = ""
    root: str = ""
    log_id: str | None = None
    key_ids: list[str] = field(default_factory=list)
    side_file: str | None = None
    failure: Failure | None = None
    warnings: list[str] = field(default_factory=list)
    dangling_intents: list[str] = field(default_factory=list)
    #: Runs with `run_started` and neither `run_finished` nor `run_suspended` (a crash or a kill).
    unfinished_runs: list[str] = field(default_factory=list)
    #: Calls whose `approval_requested` has no `approval_resolved`.
    unresolved_approvals: list[str] = field(default_factory=list)
    #: Seqs of `recovery` records: a writer stopped mid-way and the log was repaired on reopening.
    recoveries: list[int] = field(default_factory=list)

    @property
    def run_problems(self) -> int:
        """How many things the runs left open (each is a warning; `--strict` fails on any)."""
        return (len(self.dangling_intents) + len(self.unfinished_runs) + len(self.unresolved_approvals)
                + len(self.recoveries))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def scan_file(
    path: str | os.PathLike[str],
    scanner: Scanner,
    progress: Callable[[int], None] | None = None,
) -> tuple[int, int]:
    """Feed every line of `path` to `scanner`; return (lines, bytes). Raises `ScanFailure`."""
    number = offset = 0
    tail = b""
    with open(path, "rb") as f:
        while True:
            data = f.read(_CHUNK)
            if not data:
                break
            parts = _split_lines(data)
            parts[0] = tail + parts[0]  # joins the line cut at the previous chunk's end (no copy of the chunk)
            tail = parts.pop()
            if parts and len(parts[0]) > MAX_LINE_BYTES:
                raise _too_long(scanner, number, offset)
            number, offset = feed_lines(scanner, parts, number, offset)
            if len(tail) > MAX_LINE_BYTES:  # refused before it is read whole: memory stays bounded
                raise _too_long(scanner, number, offset)
            if progress is not None:
                progress(offset)
    if tail:
        raise ScanFailure(
            Failure("PARSE", scanner.count, number + 1, offset,
                    f"torn last line: {len(tail)} bytes without a newline (a crash mid-append; "
                    "opening the log with AuditLog cuts it into a recovery record)"),
            unreadable=True,
        )
    return number, offset


def _split_lines(data: bytes) -> list[bytes]:
    """``data.split(b"\\n")``, faster: `BytesIO.readlines` finds newlines with memchr where
    `bytes.split` compares byte by byte (5% of verify's instructions)."""
    parts = list(map(bytes.rstrip, BytesIO(data).readlines(), repeat(b"\n")))  # one "\n" ends each
    if not parts or data.endswith(b"\n"):
        parts.append(b"")
    return parts


def _too_long(scanner: Scanner, number: int, offset: int) -> ScanFailure:
    return ScanFailure(Failure("PARSE", scanner.count, number + 1, offset, too_long_message()))


def feed_lines(scanner: Scanner, parts: list[bytes], line: int, offset: int) -> tuple[int, int]:
    """Feed `parts` (lines without their newlines; `line` lines and `offset` bytes precede the
    first) to `scanner`; return the updated (line, offset). Raises `ScanFailure`.

    The verifier's hot loop: exactly `Scanner.feed` on each line in turn, only faster.
    There are two paths and one bookkeeping (`scan.OpenItems.note`): lines go in batches
    of `BATCH` through `_accept_batch`, the fast path, which either accepts a whole batch
    of ordinary records or changes nothing; a checkpoint, a record an anchor names, and
    any batch the fast path does not accept go through `Scanner.feed`, the reference
    path. So reports are those of feeding line by line; property tests check that the
    fast path accepts nothing the reference rejects.
    """
    if not ORJSON_FAST:
        return _feed_reference(scanner, parts, line, offset)
    pending: list[bytes] = []  # leaves of accepted records not yet in the frontier
    done = i = 0  # parts[:i] are fed; parts[:done] are accounted for in `line` and `offset`
    while i < len(parts):
        batch = parts[i : i + BATCH]
        if _accept_batch(scanner, batch, pending):
            i += len(batch)
            continue
        # Some line needs Scanner.feed, most often a checkpoint: take the lines before the
        # first line that looks like one in one pass if they pass, feed line by line up to
        # and including that line, and go on in batches after it. (How lines are grouped
        # changes no result: a batch is accepted whole or not at all.)
        cut = next((j for j, raw in enumerate(batch) if b'"kind":"checkpoint"' in raw), len(batch) - 1)
        if cut and _accept_batch(scanner, batch[:cut], pending):
            i += cut
            batch = batch[cut : cut + 1]
        else:
            batch = batch[: cut + 1]
        scanner.frontier.extend(pending)
        pending.clear()
        line += i - done
        offset += sum(map(len, parts[done:i])) + i - done
        line, offset = _feed_reference(scanner, batch, line, offset)
        i += len(batch)
        done = i
    scanner.frontier.extend(pending)
    line += len(parts) - done
    offset += sum(map(len, parts[done:])) + len(parts) - done
    return line, offset


def _accept_batch(scanner: Scanner, lines: list[bytes], pending: list[bytes]) -> bool:
    """Accept `lines` as `Scanner.feed` would, all of them, or change nothing and return False."""
    count = scanner.count
    checked = check_batch(lines, count, scanner.head, PLAIN_KINDS)
    if checked is None or not scanner.anchor_seqs.isdisjoint(range(count, count + len(lines))):
        return False
    recs, kinds, seqs, hs, leaves = checked
    scanner.open.note_many(kinds, recs, seqs)  # the bookkeeping Scanner.feed does, record by record
    pending += leaves
    scanner.count = count + len(lines)
    scanner.head = hs[-1]
    return True


def _feed_reference(scanner: Scanner, parts: list[bytes], line: int, offset: int) -> tuple[int, int]:
    """Feed `parts` one line at a time through `Scanner.feed`, the reference path."""
    feed = scanner.feed
    for raw in parts:
        line += 1
        feed(raw, line, offset)
        offset += len(raw) + 1
    return line, offset


def verify(
    path: str | os.PathLike[str],
    *,
    pubkey: PublicKeySource | None = None,
    trusted_checkpoint: str | os.PathLike[str] | None = None,
    side_file: bool = True,
    progress: Callable[[int], None] | None = None,
    workers: int | Literal["auto"] = 1,
) -> VerifyReport:
    """Stream `path` and check chain, checkpoints and anchors; never raises for a bad log.

    `workers` > 1 checks segments of the file in that many processes first (see
    `proctor.audit.parallel`); any problem, or a log under 8 MiB, falls back to the one
    sequential scan that produces every report, so the answer never depends on it.
    ``"auto"`` is `auto_workers()`: one process per usable CPU (the CLI's default).
    Raises `AuditError` only for unusable inputs (unreadable key or trusted checkpoint
    file); `FileNotFoundError`/`OSError` if the log itself cannot be read.
    """
    key = load_public_key(pubkey) if pubkey is not None else None
    report = VerifyReport(path=os.fspath(path), ok=False, records=0, bytes=0)
    anchors: list[Anchor] = []
    try:
        if trusted_checkpoint is not None:
            try:
                anchors.append(load_anchor(trusted_checkpoint, None))
            except OSError as exc:
                raise AuditError(f"cannot read the trusted checkpoint {os.fspath(trusted_checkpoint)}: "
                                 f"{exc.strerror or exc}") from exc
        side = side_file_path(path)
        if side_file and side.exists():
            report.side_file = os.fspath(side)
            anchors.append(load_anchor(side, None))
    except ScanFailure as exc:
        report.failure = exc.failure
        return report
    scanner = Scanner(pubkey=key, anchors=tuple(anchors))
    size = Path(path).stat().st_size
    processes = auto_workers() if workers == "auto" else workers
    try:
        lines: int | None = None
        if processes > 1 and size >= _PARALLEL_MIN:
            from proctor.audit.parallel import scan_parallel

            lines = scan_parallel(os.fspath(path), scanner, processes, progress)
            if lines is None:
                scanner = Scanner(pubkey=key, anchors=tuple(anchors))
        if lines is None:
            lines, _ = scan_file(path, scanner, progress)
        scanner.finish(lines, size)
    except ScanFailure as exc:
        report.failure = exc.failure
    report.ok = report.failure is None
    report.records = scanner.count
    report.bytes = size
    report.checkpoints = scanner.checkpoints
    report.signed_checkpoints = scanner.signed
    report.last_checkpoint_seq = scanner.last_checkpoint_seq
    report.head = scanner.head
    report.root = scanner.frontier.root_hex()
    report.log_id = scanner.log_id
    report.key_ids = sorted(scanner.key_ids)
    report.dangling_intents = sorted(scanner.intents)
    report.unfinished_runs = sorted(scanner.open.runs)
    report.unresolved_approvals = sorted(scanner.open.approvals)
    report.recoveries = list(scanner.open.recoveries)
    if report.ok:
        report.warnings = _warnings(scanner, report, pinned=key is not None)
    return report


def _warnings(scanner: Scanner, report: VerifyReport, *, pinned: bool) -> list[str]:
    out: list[str] = []
    last = scanner.last_checkpoint_seq
    tail = scanner.count if last is None else scanner.count - last - 1
    if tail:
        out.append(f"unsealed tail: {tail} record(s) after the last checkpoint are covered by no checkpoint; "
                   "cutting them could not be detected")
    if report.dangling_intents:
        shown = ", ".join(report.dangling_intents[:5])
        more = "…" if len(report.dangling_intents) > 5 else ""
        out.append(f"dangling intents: {len(report.dangling_intents)} call(s) with an intent and no outcome "
                   f"({shown}{more}); reopening the log records them as unknown")
    if report.unfinished_runs:
        out.append(f"unfinished runs: {len(report.unfinished_runs)} run(s) started and never finished "
                   f"({_few(report.unfinished_runs)}): the writer was killed or crashed during them")
    if report.unresolved_approvals:
        out.append(f"unresolved approvals: {len(report.unresolved_approvals)} approval request(s) without a "
                   f"resolution ({_few(report.unresolved_approvals)})")
    if report.recoveries:
        out.append(f"recovery records: {len(report.recoveries)} (at seq {_few([str(s) for s in report.recoveries])}): "
                   "a writer stopped mid-append and the log was repaired when reopened")
    unsigned = scanner.checkpoints - scanner.signed
    if unsigned:
        out.append(f"unsigned checkpoints: {unsigned}; they fix the chain's shape but prove nothing about its author")
    if scanner.signed and not pinned:
        out.append("signatures checked against the key embedded in the log "
                   f"({', '.join(sorted(scanner.key_ids))}); pass --pubkey to pin the writer's key")
    if scanner.checkpoints and report.side_file is None:
        out.append("no side file: cutting the log's tail can only be detected with --trusted-checkpoint")
    return out


def _few(items: list[str], n: int = 5) -> str:
    return ", ".join(items[:n]) + ("…" if len(items) > n else "")
