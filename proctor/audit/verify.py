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
from pathlib import Path
from typing import Any

from proctor.audit.keys import PublicKeySource, load_public_key
from proctor.audit.scan import Anchor, Failure, ScanFailure, Scanner, load_anchor
from proctor.errors import AuditError

__all__ = ["Failure", "VerifyReport", "scan_file", "side_file_path", "verify"]

_CHUNK = 1 << 20
_PARALLEL_MIN = 8 << 20  # below this, starting worker processes costs more than it saves


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
            parts = data.split(b"\n")
            parts[0] = tail + parts[0]  # joins the line cut at the previous chunk's end (no copy of the chunk)
            tail = parts.pop()
            number, offset = scanner.feed_lines(parts, number, offset)
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


def verify(
    path: str | os.PathLike[str],
    *,
    pubkey: PublicKeySource | None = None,
    trusted_checkpoint: str | os.PathLike[str] | None = None,
    side_file: bool = True,
    progress: Callable[[int], None] | None = None,
    workers: int = 1,
) -> VerifyReport:
    """Stream `path` and check chain, checkpoints and anchors; never raises for a bad log.

    `workers` > 1 checks segments of the file in that many processes first (see
    `proctor.audit.parallel`); any problem, or a log under 8 MiB, falls back to the one
    sequential scan that produces every report, so the answer never depends on it.
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
    try:
        lines: int | None = None
        if workers > 1 and size >= _PARALLEL_MIN:
            from proctor.audit.parallel import scan_parallel

            lines = scan_parallel(os.fspath(path), scanner, workers)
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
    unsigned = scanner.checkpoints - scanner.signed
    if unsigned:
        out.append(f"unsigned checkpoints: {unsigned}; they fix the chain's shape but prove nothing about its author")
    if scanner.signed and not pinned:
        out.append("signatures checked against the key embedded in the log "
                   f"({', '.join(sorted(scanner.key_ids))}); pass --pubkey to pin the writer's key")
    if scanner.checkpoints and report.side_file is None:
        out.append("no side file: cutting the log's tail can only be detected with --trusted-checkpoint")
    return out
