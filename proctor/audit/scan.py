"""The streaming state machine shared by `verify` and by `AuditLog` reopening a log.

`Scanner.feed` takes one line at a time and either accepts it (advancing seq, chain
head, Merkle frontier and the set of open intents) or raises `ScanFailure` naming the
first bad record. Checkpoints are checked against what precedes them: signature
(CKPT_SIG), then claimed size, chain head and Merkle root (CKPT_ROOT). Anchors — the
side file ``<log>.checkpoint`` and a trusted checkpoint an auditor saved — are checked
as the stream passes them (FORK) and at the end (ROLLBACK).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from proctor.audit.base import KINDS
from proctor.audit.keys import key_id, public_raw, verify_signature
from proctor.audit.lines import MAX_LINE_BYTES, too_long_message
from proctor.audit.merkle import MerkleFrontier
from proctor.audit.records import GENESIS, LineError, checkpoint_statement, is_hex64, parse_line, parse_record
from proctor.errors import ScanFailure

__all__ = ["Anchor", "Failure", "OpenItems", "ScanFailure", "Scanner", "load_anchor"]

_KINDS = frozenset(KINDS)
#: Kinds the verifier's fast loops take inline: all but checkpoints, which `Scanner.feed` checks.
PLAIN_KINDS = _KINDS - {"checkpoint"}


@dataclass(frozen=True)
class Failure:
    """The first bad record: a code from `records.CODES`, where it is, and what is wrong.

    `seq` is the index the bad record holds (or should hold) in the chain: the count of
    good records before it. `line` is 1-based; `offset` is the byte offset of the line's
    start. Both are None for a failure in a side or trusted checkpoint file itself.
    """

    code: str
    seq: int
    line: int | None
    offset: int | None
    message: str


@dataclass(frozen=True)
class Anchor:
    """A checkpoint held outside the log (side file or trusted copy) that the log must contain."""

    source: str
    record: dict[str, Any]

    @property
    def seq(self) -> int:
        return int(self.record["seq"])

    @property
    def size(self) -> int:
        return int(self.record["size"])


def load_anchor(path: str | os.PathLike[str], pubkey: Ed25519PublicKey | None) -> Anchor:
    """Read a checkpoint file (one checkpoint record line); raise `ScanFailure` if it is itself bad."""
    source = os.fspath(path)
    with Path(path).open("rb") as f:
        raw = f.read(MAX_LINE_BYTES + 2)
    if len(raw) > MAX_LINE_BYTES + 1:
        raise ScanFailure(Failure("PARSE", 0, None, None, f"{source}: {too_long_message()}"))
    raw = raw.rstrip(b"\n")
    try:
        record, computed = parse_line(raw)
    except LineError as exc:
        raise ScanFailure(Failure(exc.code, 0, None, None, f"{source}: {exc.message}")) from None
    seq = record.get("seq")
    if record.get("kind") != "checkpoint" or type(seq) is not int:
        raise ScanFailure(Failure("PARSE", 0, None, None, f"{source}: not a checkpoint record"))
    if computed != record["h"]:
        raise ScanFailure(Failure("HASH_MISMATCH", seq, None, None, f"{source}: h does not match its contents"))
    problem = _check_signature(record, pubkey)
    if problem is not None:
        raise ScanFailure(Failure(problem[0], seq, None, None, f"{source}: {problem[1]}"))
    if record.get("size") != seq:
        raise ScanFailure(Failure("CKPT_ROOT", seq, None, None, f"{source}: size differs from its seq"))
    return Anchor(source, record)


def _check_signature(rec: dict[str, Any], pinned: Ed25519PublicKey | None) -> tuple[str, str] | None:
    """(code, message) when a checkpoint record's fields or signature are wrong, else None."""
    log, size, head, root = rec.get("log"), rec.get("size"), rec.get("head"), rec.get("root")
    ts_ns = rec.get("ts_ns")
    if (not isinstance(log, str) or type(size) is not int or type(ts_ns) is not int
            or not is_hex64(head) or not is_hex64(root)):
        return "PARSE", "checkpoint needs log (string), size and ts_ns (integers), head and root (64 hex digits)"
    closed, reopened = rec.get("closed", False), rec.get("reopened", False)
    if type(closed) is not bool or type(reopened) is not bool:  # unsigned checkpoints too: `_closing` reads them
        return "PARSE", "checkpoint's closed and reopened, when present, must be true or false"
    sig, pub, kid = rec.get("sig"), rec.get("pub"), rec.get("key_id")
    if sig is None:
        if pinned is not None:
            return "CKPT_SIG", f"checkpoint is unsigned, but it must be signed by {key_id(pinned)}"
        return None
    if not (isinstance(sig, str) and isinstance(pub, str) and isinstance(kid, str)):
        return "PARSE", "signed checkpoint needs sig, pub and key_id strings"
    try:
        signature, embedded = bytes.fromhex(sig), Ed25519PublicKey.from_public_bytes(bytes.fromhex(pub))
    except ValueError:
        return "CKPT_SIG", "checkpoint sig or pub is not a hex Ed25519 value"
    key = pinned if pinned is not None else embedded
    if pinned is None and key_id(embedded) != kid:
        return "CKPT_SIG", f"key_id {kid} does not name the embedded public key"
    message = checkpoint_statement(log, size, head, root, ts_ns, closed=closed, reopened=reopened)
    if not verify_signature(key, signature, message):
        if pinned is not None and public_raw(pinned).hex() != pub:
            return "CKPT_SIG", f"checkpoint signed by {kid}, not by the given key {key_id(pinned)}"
        return "CKPT_SIG", f"checkpoint signature does not verify with {key_id(key)}"
    return None


class OpenItems:
    """What a log leaves open, kept as records pass: the one bookkeeping every checker shares.

    intents without an outcome, runs started and neither finished nor suspended, approvals
    requested and not resolved, and the seqs of `recovery` records. `Scanner.feed` (the
    reference path), the verifier's batch fast path and the parallel segment checker all
    call `note`; a segment also keeps what it closed without opening (`closed`), so `merge`
    applies it to what came before exactly as feeding its records in order would.
    """

    __slots__ = ("approvals", "closed", "intents", "recoveries", "runs")

    def __init__(self, *, segment: bool = False) -> None:
        self.intents: dict[str, dict[str, Any]] = {}
        self.runs: dict[str, int] = {}
        self.approvals: dict[str, int] = {}
        self.recoveries: list[int] = []
        # Per item kind, ids a segment closed (their opening may lie in an earlier segment).
        self.closed: dict[str, set[str]] | None = {"intents": set(), "runs": set(), "approvals": set()} \
            if segment else None

    def note(self, kind: str, rec: dict[str, Any], seq: int) -> None:
        """Account for one accepted record."""
        if kind in _BOOK:
            self._book(kind, rec, seq)

    def note_many(self, kinds: list[str], recs: list[dict[str, Any]], seqs: list[int]) -> None:
        """`note` each record in turn, with intents and outcomes (most records) taken inline.

        The verifier's fast loops call this once per batch: a call of `note` per record
        was 2% of verify's instructions. Tests check it against `note` record by record.
        """
        intents, closed, book = self.intents, self.closed, _BOOK
        for kind, rec, seq in zip(kinds, recs, seqs, strict=True):
            if kind == "call_intent":
                key = rec.get("call_id")
                if isinstance(key, str):
                    intents[key] = {"seq": seq, "run_id": rec.get("run_id"), "tool": rec.get("tool")}
            elif kind == "call_outcome":
                key = rec.get("call_id")
                if isinstance(key, str):
                    intents.pop(key, None)
                    if closed is not None:
                        closed["intents"].add(key)
            elif kind in book:
                self._book(kind, rec, seq)

    def _book(self, kind: str, rec: dict[str, Any], seq: int) -> None:
        """What record `rec` (at `seq`, of a kind in `_BOOK`) opens or closes."""
        action, which, field = _BOOK[kind]
        if action == "recovery":
            self.recoveries.append(seq)
        elif action == "open":
            value: Any = seq
            if which == "intents":
                value = {"seq": seq, "run_id": rec.get("run_id"), "tool": rec.get("tool")}
            self._open(which, rec.get(field), value)
        else:
            self._close(which, rec.get(field))

    def _open(self, which: str, key: Any, value: Any) -> None:
        if isinstance(key, str):
            getattr(self, which)[key] = value

    def _close(self, which: str, key: Any) -> None:
        if isinstance(key, str):
            getattr(self, which).pop(key, None)
            if self.closed is not None:
                self.closed[which].add(key)

    def merge(self, later: OpenItems) -> None:
        """Apply a later segment's records (kept as its open and closed items) to these."""
        assert later.closed is not None
        for which in ("intents", "runs", "approvals"):
            mine = getattr(self, which)
            for key in later.closed[which]:
                mine.pop(key, None)
            mine.update(getattr(later, which))
        self.recoveries += later.recoveries


#: What each kind of record does to the open items: (action, which items, the field holding the key). An
#: opened intent keeps its seq, run and tool; an opened run or approval its seq.
_BOOK: dict[str, tuple[Literal["open", "close", "recovery"], str, str]] = {
    "call_intent": ("open", "intents", "call_id"),
    "call_outcome": ("close", "intents", "call_id"),
    "run_started": ("open", "runs", "run_id"),
    "run_resumed": ("open", "runs", "run_id"),
    "run_finished": ("close", "runs", "run_id"),
    "run_suspended": ("close", "runs", "run_id"),
    "approval_requested": ("open", "approvals", "call_id"),
    "approval_resolved": ("close", "approvals", "call_id"),
    "recovery": ("recovery", "", ""),
}


@dataclass
class Scanner:
    """Accepts records one line at a time; see the module docstring."""

    pubkey: Ed25519PublicKey | None = None
    anchors: tuple[Anchor, ...] = ()
    count: int = 0
    head: str = GENESIS
    frontier: MerkleFrontier = field(default_factory=MerkleFrontier)
    open: OpenItems = field(default_factory=OpenItems)
    log_id: str | None = None
    checkpoints: int = 0
    signed: int = 0
    last_checkpoint_seq: int | None = None
    key_ids: set[str] = field(default_factory=set)
    #: The latest checkpoint a writer closed the log with, while no reopening checkpoint follows it.
    closed_by: dict[str, Any] | None = None
    #: The seqs the anchors name: `feed` and the fast loops ask per record with a set lookup.
    anchor_seqs: frozenset[int] = field(init=False, repr=False, default=frozenset())

    def __post_init__(self) -> None:
        self.anchor_seqs = frozenset(a.seq for a in self.anchors)

    @property
    def intents(self) -> dict[str, dict[str, Any]]:
        """Calls with an intent and no outcome yet: call id -> {seq, run_id, tool}."""
        return self.open.intents

    def _fail(self, code: str, message: str, line: int | None, offset: int | None) -> ScanFailure:
        return ScanFailure(Failure(code, self.count, line, offset, message))

    def feed(self, raw: bytes, line: int, offset: int) -> None:
        """Check one line (without its newline) and accept it, or raise `ScanFailure`."""
        pos = self.count
        try:
            rec, leaf = parse_record(raw)
        except LineError as exc:
            raise ScanFailure(Failure(exc.code, pos, line, offset, exc.message), unreadable=exc.unreadable) from None
        h = rec["h"]
        computed = leaf.hex()
        if computed != h:
            raise self._fail("HASH_MISMATCH", f"h does not match the record's contents (computed {computed[:16]}…)",
                             line, offset)
        seq, kind = rec.get("seq"), rec.get("kind")
        if type(seq) is not int or type(rec.get("ts_ns")) is not int or type(kind) is not str or kind not in _KINDS:
            raise self._fail("PARSE", "envelope needs integer seq and ts_ns and a known kind", line, offset)
        if seq != pos:
            raise self._fail("SEQ_GAP", f"expected seq {pos}, found seq {seq}", line, offset)
        if rec.get("prev") != self.head:
            raise self._fail("PREV_MISMATCH", "prev is not the previous record's h", line, offset)
        if kind == "checkpoint":
            self.check_checkpoint(rec, line, offset)
        else:
            self.open.note(kind, rec, pos)
        if pos in self.anchor_seqs:
            self.check_anchors(pos, h, line, offset)
        self.head = h
        self.frontier.append(leaf)  # equal to bytes.fromhex(h): checked above
        self.count = pos + 1

    def check_anchors(self, pos: int, h: str, line: int, offset: int) -> None:
        """Check the outside anchors naming record `pos` (whose hash is `h`) against the chain so far;
        ScanFailure names the first that does not hold. The parallel verifier calls it when it stitches
        a segment in (`proctor.audit.parallel`)."""
        # Checked at the record the anchor names, after that record's own checks: evidence
        # inside the log (a checkpoint's CKPT_ROOT/CKPT_SIG) is reported before outside evidence.
        for anchor in self.anchors:
            if anchor.seq != pos:
                continue
            if self.frontier.root_hex() != anchor.record["root"]:
                raise self._at(pos, "FORK", f"the first {anchor.size} records do not have the root that "
                               f"{anchor.source} commits to: the log was rewritten", line, offset)
            if anchor.record["h"] != h:
                raise self._at(pos, "FORK", f"record {pos} differs from the checkpoint in {anchor.source}",
                               line, offset)

    def _at(self, seq: int, code: str, message: str, line: int | None, offset: int | None) -> ScanFailure:
        return ScanFailure(Failure(code, seq, line, offset, message))

    def check_checkpoint(self, rec: dict[str, Any], line: int, offset: int) -> None:
        """Check checkpoint `rec` (its signature, size, head and Merkle root) against the chain so far;
        ScanFailure names the first problem. Also called by the parallel verifier when it stitches."""
        problem = _check_signature(rec, self.pubkey)
        if problem is not None:
            raise self._fail(problem[0], problem[1], line, offset)
        pos = self.count
        if rec["size"] != pos:
            raise self._fail("CKPT_ROOT", f"checkpoint claims {rec['size']} records but {pos} precede it",
                             line, offset)
        if rec["head"] != self.head:
            raise self._fail("CKPT_ROOT", "checkpoint's chain head is not the previous record's h: "
                             "records before it were changed and re-chained", line, offset)
        if rec["root"] != self.frontier.root_hex():
            raise self._fail("CKPT_ROOT", "checkpoint's Merkle root does not match the records before it",
                             line, offset)
        if self.log_id is not None and rec["log"] != self.log_id:
            raise self._fail("FORK", f"checkpoint names log {rec['log']}, earlier ones {self.log_id}", line, offset)
        self._closing(rec, pos, line, offset)
        self.log_id = rec["log"]
        self.checkpoints += 1
        self.last_checkpoint_seq = pos
        if rec.get("sig") is not None:
            self.signed += 1
            self.key_ids.add(str(rec.get("key_id")))

    def _closing(self, rec: dict[str, Any], pos: int, line: int, offset: int) -> None:
        # Records appended after a closed log must start with a reopening checkpoint signed like
        # the closing one: anyone can chain records (the hash chain has no key), only the key's
        # holder can sign that a writer opened the log again.
        closed = self.closed_by
        if closed is not None:
            if pos != closed["size"] + 1:
                raise self._after_close(closed)
            if rec.get("reopened") is not True:
                raise self._fail("AFTER_CLOSE", "the log was closed, and the checkpoint after it does not say it "
                                 "was reopened", line, offset)
            if closed.get("sig") is not None and rec.get("key_id") != closed.get("key_id"):
                raise self._fail("AFTER_CLOSE", f"the log was closed by a checkpoint signed by {closed['key_id']}, "
                                 f"and reopened by one signed by {rec.get('key_id') or 'no key'}", line, offset)
        self.closed_by = rec if rec.get("closed") is True else None

    def _after_close(self, closed: dict[str, Any]) -> ScanFailure:
        pos = closed["size"] + 1  # the first record after the closing checkpoint, on line pos + 1
        signer = f"signed by {closed['key_id']}" if closed.get("sig") is not None else "unsigned"
        return ScanFailure(Failure(
            "AFTER_CLOSE", pos, pos + 1, None,
            f"records follow the checkpoint that closed the log at seq {pos - 1} ({signer}) without a "
            "checkpoint saying a writer reopened it: they were appended by someone else"))

    def finish(self, lines: int, size: int) -> None:
        """End-of-log checks: anchors signed by the pinned key; a log shorter than an anchor was cut."""
        for anchor in self.anchors:
            problem = _check_signature(anchor.record, self.pubkey) if self.pubkey is not None else None
            if problem is not None:
                raise ScanFailure(Failure(problem[0], anchor.seq, None, None, f"{anchor.source}: {problem[1]}"))
        if self.closed_by is not None and self.count > self.closed_by["size"] + 1:
            raise self._after_close(self.closed_by)
        for anchor in self.anchors:
            if self.count <= anchor.seq:
                raise ScanFailure(Failure(
                    "ROLLBACK", self.count, lines + 1, size,
                    f"log ends after {self.count} records, but {anchor.source} holds a checkpoint at seq "
                    f"{anchor.seq}: records were cut (truncation or rollback)"))
        if self.pubkey is not None and self.count and not self.signed and not self.anchors:
            # Anyone can chain records (the chain has no key): with a key pinned, a log none of whose
            # checkpoints that key signed proves nothing about who wrote it — e.g. one rewritten whole,
            # its signed checkpoints dropped.
            raise ScanFailure(Failure(
                "CKPT_SIG", self.count, lines + 1, size,
                f"no checkpoint of the log's {self.count} record(s) is signed by {key_id(self.pubkey)}: nothing "
                "proves who wrote them (signed checkpoints removed, or none written yet: a writer signs one on "
                "close and every N records)"))
