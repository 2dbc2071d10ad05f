"""`AuditLog`: the write-ahead, hash-chained, checkpointed audit trail (an `AuditSink`).

```python
with AuditLog("audit.jsonl", signing_key="audit.key") as log:
    r = log.append("call_intent", {"call_id": "c1", "tool": "send_email", ...})
    if not r.ok:            # the intent is not on disk: the gate refuses the call
        ...
```

One writer per file, across threads and processes, whatever path names it (`flock` on the
log file itself). Every append is one
``write`` of one canonical line, then ``fsync`` when durable (concurrent durable appends
share one fsync: group commit; each returns once its line is on disk); a failed write marks the
log failed and every later append reports it — nothing is dropped silently. Opening
an existing log re-verifies it, cuts a torn last line (bytes after the last newline, and
only those) into a `recovery` record and closes dangling intents with `unknown` outcomes
(calls are never retried). Anything else that does not verify — a complete last line that
does not parse or whose hash is wrong — is tampering: `AuditCorrupted`, nothing appended.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import hashlib
import json
import mmap
import os
import re
import secrets
import threading
import time
import weakref
from _thread import allocate_lock as _allocate_lock
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

from proctor.audit.base import AuditResult, derive_key
from proctor.audit.keys import KeySource, key_id, load_private_key, public_raw
from proctor.audit.lines import MAX_LINE_BYTES
from proctor.audit.lockfile import lock_log, unlock_log
from proctor.audit.records import append_problem, checkpoint_statement, seal_owned
from proctor.audit.scan import Anchor, ScanFailure, Scanner, load_anchor
from proctor.audit.storage import atomic_write, read_or_create_secret, sync_dir, sync_fd, write_all
from proctor.audit.verify import scan_file, side_file_path
from proctor.canonical import canonical_bytes
from proctor.errors import AuditCorrupted, AuditError, ConfigurationError
from proctor.redaction import Redacted, redact_args
from proctor.urls import shown_url

__all__ = ["DURABILITIES", "AuditLog"]

#: A URL of a backend made a `Path` (``Path("postgresql://h/db")`` is ``postgresql:/h/db``): its scheme and slash.
_FOLDED_URL = re.compile(r"((?:postgres|postgresql|redis|rediss|sqlite|file|https?)):/(?!/)", re.IGNORECASE)

DURABILITIES = ("fsync", "flush")
_CUT_INLINE_MAX = 4096  # cut bytes up to this size are kept in the recovery record itself


class AuditLog:
    """An append-only audit log file; see the module docstring and docs/audit.md."""

    #: Share fsyncs between concurrent durable appends; False only to measure the difference.
    _group_commit = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        signing_key: KeySource | None = None,
        durability: str = "fsync",
        checkpoint_every: int = 1000,
        checkpoint_interval_s: float = 60.0,
        redaction_key: bytes | None = None,
    ) -> None:
        if durability not in DURABILITIES:
            raise ConfigurationError(f"durability must be one of {DURABILITIES}, not {durability!r}")
        if checkpoint_every < 1 or checkpoint_interval_s <= 0:
            raise ConfigurationError("checkpoint_every must be ≥ 1 and checkpoint_interval_s > 0")
        text = os.fspath(path)
        folded = _FOLDED_URL.match(text)
        if folded is not None:  # `Path(url)` folds the `//` of `scheme://` into one slash: the same URL
            text = f"{folded.group(1)}://{text[folded.end():]}"
        if "://" in text:
            # A URL taken for a path would write the fleet's trail to a local file (`postgresql:/…`) that no
            # one reads, while every reader looks in the database: refuse it, naming what opens a URL.
            raise ConfigurationError(
                f"AuditLog takes a file path, not the URL {shown_url(text)!r}: open a PostgreSQL log with "
                "proctor.audit.postgres.PostgresAuditLog(URL), or either kind with proctor.backends.open_audit(URL)")
        self.path = Path(path)
        self.durability = durability
        self._every = checkpoint_every
        self._interval = checkpoint_interval_s
        self._key = load_private_key(signing_key) if signing_key is not None else None
        self._mutex = threading.Lock()
        # Group commit: durable appends write under `_mutex`, then share fsyncs. One thread at a time
        # (the leader) fsyncs everything written so far; each other one waits on a lock of its own in
        # `_waiters` (bytes it needs on disk, lock) and is woken once: when an fsync covered its line
        # (`_synced`, bytes known to be on disk), or to lead the next fsync. `_idle` (on `_sync_lock`)
        # tells close() when no fsync is in flight. Lock order: _mutex, then _sync_lock.
        self._sync_lock = threading.Lock()
        self._idle = threading.Condition(self._sync_lock)
        self._waiters: list[tuple[int, Any]] = []
        self._next_leader: Any = None  # the waiter's lock released to lead the next fsync
        self._synced = 0
        self._syncing = False
        self._closing = False
        self._fsync_under_mutex = False  # a checkpoint's (or recovery's) fsync is in flight: see _acknowledged
        self.error: str | None = None
        self.closed = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise AuditError(f"cannot create the directory of {self.path}: {exc.strerror or exc}") from exc
        try:
            existed = self.path.exists()
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise AuditError(f"cannot open the audit log {self.path}: {exc.strerror or exc}") from exc
        try:
            # The writer lock is on the file itself, so a symlink, hard link or `..` path to a
            # log another AuditLog holds is refused like the same path (docs/audit.md §1).
            lock_log(self._fd, self.path)
        except BaseException:
            os.close(self._fd)
            raise
        try:
            self._redaction_key = redaction_key or read_or_create_secret(Path(os.fspath(path) + ".redact-key"))
            self._open(existed)
        except OSError as exc:
            unlock_log(self._fd)
            raise AuditError(f"cannot open the audit log {self.path}: {exc.strerror or exc}") from exc
        except ValueError as exc:
            unlock_log(self._fd)
            raise AuditError(f"cannot open the audit log {self.path}: {exc}") from exc
        except BaseException:
            unlock_log(self._fd)
            raise
        # A program that forgets close() still seals its log with a checkpoint when it exits
        # normally; the hook holds the log weakly so it does not keep an abandoned log alive.
        ref = weakref.ref(self)
        self._at_exit = lambda: _close_if_alive(ref)
        atexit.register(self._at_exit)
        _OPEN.add(self)

    # -- opening and recovery -------------------------------------------------------------

    def _open(self, existed: bool) -> None:
        if not existed:
            sync_dir(self.path.parent)  # the new file's directory entry must survive a crash too
        self._recover()

    def _corrupted(self, exc: ScanFailure, what: str) -> AuditCorrupted:
        f = exc.failure
        where = f"seq {f.seq}" + (f", line {f.line}, byte offset {f.offset}" if f.line is not None else "")
        return AuditCorrupted(f"{self.path}: {what} at {where}: {f.code} {f.message}; not appending to it",
                              seq=f.seq, line=f.line, offset=f.offset)

    def _recover(self) -> None:
        side = side_file_path(self.path)
        anchors: tuple[Anchor, ...] = ()
        try:
            if side.exists():
                anchors = (load_anchor(side, None),)
        except ScanFailure as exc:
            raise self._corrupted(exc, f"its checkpoint side file {side} is damaged") from None
        scanner = Scanner(anchors=anchors)
        size = os.fstat(self._fd).st_size
        cut: dict[str, Any] | None = None
        try:
            lines, _ = scan_file(self.path, scanner)
        except ScanFailure as exc:
            f = exc.failure
            assert f.offset is not None and f.line is not None
            if not exc.unreadable:  # checked first: an over-long line is never read whole
                raise self._corrupted(exc, "the log is damaged (run `proctor audit verify` on it)") from None
            rest = os.pread(self._fd, size - f.offset, f.offset)
            if not (exc.unreadable and b"\n" not in rest):
                # Only bytes after the last newline can be a crash mid-append (a line is written
                # whole, newline last). A complete line that does not parse or chain is tampering.
                raise self._corrupted(exc, "the log is damaged (run `proctor audit verify` on it)") from None
            # A torn last line: what a crash mid-append leaves. Cut it, but keep a record of it.
            cut = {"offset": f.offset, "line": f.line, "bytes": len(rest),
                   "sha256": hashlib.sha256(rest).hexdigest(), "reason": f.message}
            if len(rest) <= _CUT_INLINE_MAX:
                cut["b64"] = base64.b64encode(rest).decode("ascii")
            size, lines = f.offset, f.line - 1
        try:
            scanner.finish(lines, size)  # before any cut: a log behind its side file is evidence, not a crash
        except ScanFailure as exc:
            what = ("records were appended after it was closed" if exc.failure.code == "AFTER_CLOSE"
                    else "the log is shorter than its checkpoint side file")
            raise self._corrupted(exc, what) from None
        if cut is not None:
            os.ftruncate(self._fd, size)
            sync_fd(self._fd)
        self._size = size
        self._seq = scanner.count
        self._head = scanner.head
        self._frontier = scanner.frontier
        self.log_id = scanner.log_id or secrets.token_hex(16)
        last = scanner.last_checkpoint_seq
        self._since = self._seq if last is None else self._seq - last - 1
        self._last_ckpt = time.monotonic()
        self._closed_by: dict[str, Any] | None = scanner.closed_by
        if self._closed_by is not None and self._closed_by.get("sig") is not None:
            kid = self._closed_by.get("key_id")
            if self._key is None or key_id(self._key) != kid:
                raise AuditError(f"{self.path} was closed by a checkpoint signed by {kid}: append to it with that "
                                 "signing key (--audit-key), or start a new log")
        dangling = sorted(scanner.intents.items(), key=lambda item: int(item[1]["seq"]))
        if cut is None and not dangling:
            return
        if self._closed_by is not None:
            reopened = self._reopen()
            if not reopened.ok:
                raise AuditError(f"{self.path}: cannot record recovery: {reopened.error}")
        results = [self._write("recovery", {"cut": cut, "unknown_calls": [c for c, _ in dangling]}, True)]
        for call_id, intent in dangling:
            results.append(self._write("call_outcome", {
                "call_id": call_id, "run_id": intent["run_id"], "tool": intent["tool"], "status": "unknown",
                "intent_seq": intent["seq"],
                "reason": "the writer stopped before recording an outcome; the call was not retried",
            }, True))
        failed = next((r for r in results if not r.ok), None)
        if failed is None:
            try:
                sync_fd(self._fd)  # recovery records are durable whatever the log's durability
            except OSError as exc:
                failed = self._failed(f"fsync of {self.path} failed: {exc.strerror or exc}")
        if failed is not None:
            raise AuditError(f"{self.path}: cannot record recovery: {failed.error}")

    def _reopen(self) -> AuditResult:
        """Before the first record appended to a closed log: a checkpoint saying it was reopened.

        Written only when something is appended, so opening a closed log and closing it again
        leaves it as it was (the key was checked on opening). Callers check `_closed_by` first.
        """
        result = self._checkpoint(reopened=True)
        if result.ok:
            self._closed_by = None
        return result

    # -- appending ------------------------------------------------------------------------

    def append(self, kind: str, fields: Mapping[str, Any], *, durable: bool = True) -> AuditResult:
        """Append one record; with `durable` (and durability "fsync") it is fsynced before this returns.

        Concurrent durable appends share fsyncs (group commit): each returns once an fsync that
        started after its record was written has completed, so N threads pay far fewer than N fsyncs.
        """
        with self._mutex:
            if self.closed or self.error is not None:
                return AuditResult(False, error=self._refusal())
            problem = append_problem(kind, fields)
            if problem is not None:
                return AuditResult(False, error=problem)
            if self._closed_by is not None:
                reopened = self._reopen()
                if not reopened.ok:
                    return reopened
            if self._since >= self._every or (self._since and time.monotonic() - self._last_ckpt >= self._interval):
                sealed = self._checkpoint()
                if not sealed.ok:
                    return sealed
            if not self._group_commit:  # one fsync per durable record, under the lock (bench/concurrency.py)
                return self._write(kind, dict(fields), durable)
            result = self._write(kind, dict(fields), False)
            if not result.ok or not durable or self.durability != "fsync":
                return result
            target = self._size
        synced = self._sync_through(target, result)
        return self._acknowledged(synced) if synced.ok else synced

    def _refusal(self) -> str:
        if self.closed:
            return f"audit log {self.path} is closed"
        return f"audit log {self.path} failed earlier and takes no more records: {self.error}"

    def _acknowledged(self, result: AuditResult) -> AuditResult:
        """`result`, whose fsync succeeded, unless the log failed meanwhile. Linux tells a failed writeback to
        one fsync of a descriptor only: an fsync that overlapped a failed one (a checkpoint's, under `_mutex`)
        may return 0 over lost bytes. So wait for the verdict of such an fsync in flight, and acknowledge
        nothing once the log has failed. Called holding no lock."""
        if self._fsync_under_mutex:
            with self._mutex:
                pass
        if self.error is not None:
            return AuditResult(False, error=f"audit log {self.path} failed while the record was synced: {self.error}")
        return result

    def _sync_through(self, target: int, result: AuditResult) -> AuditResult:
        """Return `result` once the first `target` bytes are on disk (fsyncing them, or waiting for the
        fsync another thread is doing); a failed fsync fails the log, and this record with it."""
        with self._sync_lock:
            if self._synced >= target:
                return result
            if self.error is not None or self._closing:
                return self._not_on_disk()
            if self._syncing:  # follow: sleep until an fsync covers the line, or until asked to lead
                waiter = _allocate_lock()
                waiter.acquire()
                self._waiters.append((target, waiter))
            else:
                waiter = None
                self._syncing = True
        if waiter is not None:
            waiter.acquire()  # released exactly once, by the thread that covered or chose this one
            with self._sync_lock:
                chosen = self._next_leader is waiter  # then `_syncing` was left set for this thread
                if chosen:
                    self._next_leader = None
                if self._synced >= target:  # covered (a checkpoint's fsync may cover the one chosen, too)
                    if chosen:
                        self._wake_covered(lead=True)  # pass the fsync on, or end it
                    return result
                if self.error is not None or self._closing:
                    if chosen:  # to lead a failed log: end it for all
                        self._end_syncing()
                    return self._not_on_disk()
        upto = self._size  # everything written so far rides on this fsync (an int read: atomic)
        try:
            sync_fd(self._fd)
        except OSError as exc:
            return self._sync_failed(exc)
        with self._sync_lock:
            if upto > self._synced:
                self._synced = upto
            self._wake_covered(lead=True)
        return result

    def _wake_covered(self, *, lead: bool) -> None:
        """Wake the waiters whose lines are on disk; with `lead`, hand the fsync on to the first other one
        (or end it). Called holding `_sync_lock`."""
        synced, left = self._synced, []
        for item in self._waiters:
            if item[0] <= synced:
                item[1].release()
            else:
                left.append(item)
        self._waiters = left
        if lead:
            if left and self.error is None and not self._closing:  # it fsyncs next: its line and all since
                self._next_leader = left.pop(0)[1]
                self._next_leader.release()
            else:
                self._end_syncing()

    def _end_syncing(self) -> None:
        """No fsync in flight any more: every waiter left wakes (to an error, or to close). Holding `_sync_lock`."""
        for _, waiter in self._waiters:
            waiter.release()
        self._waiters = []
        self._syncing = False
        self._idle.notify_all()

    def _not_on_disk(self) -> AuditResult:
        return AuditResult(False, error=self.error or f"audit log {self.path} closed before the record was on disk")

    def _sync_failed(self, failure: OSError) -> AuditResult:
        reason = f"fsync of {self.path} failed: {failure.strerror or failure}"
        with self._sync_lock:  # every waiter wakes to the error (before `_mutex`: close() may hold it, waiting)
            self.error = self.error or reason
            self._end_syncing()
        with self._mutex:
            if self.closed:  # never touch a closed descriptor (its number may belong to another file)
                return AuditResult(False, error=reason)
            return self._failed(reason)

    def _mark_synced(self) -> None:
        """Everything written is on disk (after an fsync done under `_mutex`)."""
        with self._sync_lock:
            if self._size > self._synced:
                self._synced = self._size
            self._wake_covered(lead=False)

    def _write(self, kind: str, fields: dict[str, Any], durable: bool, ts_ns: int | None = None) -> AuditResult:
        seq = self._seq
        fields["seq"] = seq
        fields["ts_ns"] = time.time_ns() if ts_ns is None else ts_ns
        fields["kind"] = kind
        fields["prev"] = self._head
        try:
            line, h, leaf = seal_owned(fields)
        except (TypeError, ValueError, RecursionError) as exc:
            return AuditResult(False, error=f"cannot encode the {kind} record: {exc}")
        size = len(line)
        if size > MAX_LINE_BYTES:  # readers refuse longer lines, so it would make the log unverifiable
            return AuditResult(False, error=f"the {kind} record is {size - 1} bytes, over the "
                                            f"{MAX_LINE_BYTES}-byte line limit; redact or shorten its fields")
        synced = durable and (self.durability == "fsync" or kind == "checkpoint")
        try:
            write_all(self._fd, line)
            if synced:
                self._fsync_under_mutex = True
                self._sync_written(self._size + size)
        except OSError as exc:
            return self._failed(f"writing {self.path} failed: {exc.strerror or exc}")
        finally:  # after `_failed` set the error (`_acknowledged` reads the flag, then the error)
            self._fsync_under_mutex = False
        self._size += size
        if synced:
            self._mark_synced()
        self._seq = seq + 1
        self._head = h
        self._frontier.append(leaf)
        self._since = 0 if kind == "checkpoint" else self._since + 1
        return AuditResult(True, seq)

    def _sync_written(self, end: int) -> None:
        """The fsync of a record written under `_mutex` (checkpoint, recovery, one fsync per record), never
        beside another fsync of the descriptor: Linux tells a failed writeback to one of two overlapping
        fsyncs only, and the other's success would vouch for lost bytes. With group commit it waits for the
        fsync in flight and holds the turn over its own."""
        if not self._group_commit:
            sync_fd(self._fd)
            return
        with self._sync_lock:
            while self._syncing:
                self._idle.wait()
            self._syncing = True
        try:
            sync_fd(self._fd)
        except OSError as exc:
            with self._sync_lock:  # every waiter wakes to the error
                self.error = self.error or f"fsync of {self.path} failed: {exc.strerror or exc}"
                self._end_syncing()
            raise
        with self._sync_lock:
            if end > self._synced:
                self._synced = end
            self._wake_covered(lead=True)  # covers every line written (the mutex is held); else hands on

    def _failed(self, reason: str) -> AuditResult:
        self.error = reason
        # Best effort: drop a partial line so the file ends on a record boundary.
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, self._size)
        return AuditResult(False, error=reason)

    # -- checkpoints ----------------------------------------------------------------------

    def checkpoint(self) -> AuditResult:
        """Write a checkpoint now (also done every N records, every T seconds and on close)."""
        with self._mutex:
            if self.closed or self.error is not None:
                return AuditResult(False, error=self.error or f"audit log {self.path} is closed")
            return self._reopen() if self._closed_by is not None else self._checkpoint()

    def _checkpoint(self, *, closed: bool = False, reopened: bool = False) -> AuditResult:
        ts_ns = time.time_ns()
        size, head, root = self._seq, self._head, self._frontier.root_hex()
        fields: dict[str, Any] = {"log": self.log_id, "size": size, "head": head, "root": root,
                                  "key_id": None, "pub": None, "sig": None}
        if closed:
            fields["closed"] = True
        if reopened:
            fields["reopened"] = True
        if self._key is not None:
            statement = checkpoint_statement(self.log_id, size, head, root, ts_ns, closed=closed, reopened=reopened)
            fields.update(key_id=key_id(self._key), pub=public_raw(self._key.public_key()).hex(),
                          sig=self._key.sign(statement).hex())
        start = self._size
        result = self._write("checkpoint", fields, True, ts_ns)
        if not result.ok:
            return result
        self._last_ckpt = time.monotonic()
        try:
            line = os.pread(self._fd, self._size - start, start)
            atomic_write(side_file_path(self.path), line)
        except OSError as exc:
            return self._failed(f"writing the checkpoint side file failed: {exc.strerror or exc}")
        return result

    # -- the rest of the sink -------------------------------------------------------------

    def key_for(self, purpose: str) -> bytes:
        """This sink's secret derived for `purpose` (`AuditSink.key_for`)."""
        return derive_key(self._redaction_key, purpose)

    def run_records(self, run_id: str) -> list[dict[str, Any]]:
        """Every record of run `run_id` in the file, in order (`AuditReader`): only its lines are decoded."""
        return self._read_run(run_id, None)

    def run_records_from(self, run_id: str, start: int) -> list[dict[str, Any]]:
        """`run_records(run_id)` read from the run's `run_started`, record `start` (`AuditStartReader`): what the
        run's records cost, not the records of the runs before it.

        `start` comes from a store nobody trusts, so it is not believed: the line of that seq is found (a binary
        search over the file, whose lines are in seq order) and used only if it is `run_started` of this very
        run. Beginning there drops no record of the run, because the gate writes a run's `run_started` before
        anything else of it (`Gate.start_run`, required) and a run starts once in a log. So a start that is
        wrong — another run's start, another record, a seq the file does not have, a line the search cannot
        read — is a read of the whole file, never fewer records; a right one yields what the whole file would.
        """
        return self._read_run(run_id, start)

    def _read_run(self, run_id: str, start: int | None) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    return []
                with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as view:
                    begin = _run_start(view, size, run_id, start) if start is not None else None
                    return _records_of(view, size, run_id, begin or 0)
        except OSError as exc:
            raise AuditError(f"cannot read the audit log {self.path}: {exc.strerror or exc}") from exc

    def redact(self, args: Mapping[str, Any], fields: Sequence[str]) -> Redacted:
        """Replace `fields` of `args` by HMAC digests keyed with this log's redaction key."""
        return redact_args(args, fields, self._redaction_key)

    @property
    def seq(self) -> int:
        """The seq the next record will get (= records in the log)."""
        return self._seq

    @property
    def head(self) -> str:
        return self._head

    @property
    def key_id(self) -> str | None:
        return key_id(self._key) if self._key is not None else None

    def root(self) -> str:
        """RFC 6962 root over every record so far."""
        with self._mutex:
            return self._frontier.root_hex()

    def close(self) -> None:
        """Seal with a closing checkpoint (records after it must start by reopening), fsync, release the lock."""
        with self._mutex:
            if self.closed:
                return
            try:
                if self.error is None and self._closed_by is None:  # else nothing was appended: still closed
                    self._checkpoint(closed=True)
            finally:
                with self._sync_lock:  # let an fsync in flight finish before the descriptor goes
                    while self._syncing:
                        self._idle.wait()
                    self._closing = True
                    for _, waiter in self._waiters:  # none is left once the final fsync covered them
                        waiter.release()
                    self._waiters = []
                self.closed = True
                unlock_log(self._fd)
                atexit.unregister(self._at_exit)

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("failed" if self.error else "open")
        return f"AuditLog({os.fspath(self.path)!r}, records={self._seq}, {state})"

    @staticmethod
    def _after_fork_in_child() -> None:
        """A forked child shares its parent's descriptor and lock but not its sequence, chain head or file
        size: two writers would interleave records with the same seq (the log no longer verifies) and the
        child's close() would unlock the parent's log. In the child each log is closed for writing without
        touching the file or the lock: its appends are refused ("is closed"), so the gate runs no tool there."""
        for log in list(_OPEN):
            AuditLog._closed_in_child(log)

    def _closed_in_child(self) -> None:
        self._mutex = threading.Lock()  # another thread of the parent may have held it at the fork
        self.closed = True
        atexit.unregister(self._at_exit)

    # Once per process, when the class is made (at fork, not per append); a staticmethod is callable here.
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _close_if_alive(ref: weakref.ReferenceType[AuditLog]) -> None:
    log = ref()
    if log is not None:
        log.close()


#: Every AuditLog of this process, so that a forked child stops writing its parent's logs (at fork, not per append).
_OPEN: weakref.WeakSet[AuditLog] = weakref.WeakSet()


def _loads(raw: bytes) -> Any:
    """A line's JSON (orjson, or json where orjson refuses valid JSON such as ints past 64 bits); None if neither."""
    try:
        return orjson.loads(raw)
    except ValueError:
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            return None


def _line_from(view: mmap.mmap, size: int, pos: int) -> tuple[int, int] | None:
    """(start, end) of the first whole line that starts at or after `pos` (end: past its newline), or None."""
    start = 0 if pos == 0 else view.find(b"\n", pos - 1, size) + 1
    if start == 0 and pos != 0:
        return None
    end = view.find(b"\n", start, size)
    return (start, end + 1) if end != -1 else None


def _run_start(view: mmap.mmap, size: int, run_id: str, seq: int) -> int | None:
    """The byte offset of record `seq` if it is run `run_id`'s `run_started`, else None (see `run_records`)."""
    lo, hi = 0, size  # a line starting at lo has seq <= the one looked for (lo = 0: the first line)
    while hi - lo > 1 << 16:
        mid = (lo + hi) // 2
        line = _line_from(view, size, mid)
        if line is None or line[0] >= hi:
            hi = mid
            continue
        rec = _loads(view[line[0]:line[1]])
        at = rec.get("seq") if isinstance(rec, dict) else None
        if not isinstance(at, int):
            return None
        if at == seq:
            lo = line[0]
            break
        if at < seq:
            lo = line[0]
        else:
            hi = mid
    pos = lo
    while pos < size:  # the last stretch, line by line
        line = _line_from(view, size, pos)
        if line is None:
            return None
        rec = _loads(view[line[0]:line[1]])
        if not isinstance(rec, dict) or not isinstance(rec.get("seq"), int) or rec["seq"] > seq:
            return None
        if rec["seq"] == seq:
            ok = rec.get("kind") == "run_started" and rec.get("run_id") == run_id
            return line[0] if ok else None
        pos = line[1]
    return None


def _records_of(view: mmap.mmap, size: int, run_id: str, begin: int) -> list[dict[str, Any]]:
    """The records of run `run_id` in the lines from byte `begin` on. Lines without the id as the log writes it
    (canonical JSON) are skipped unread, by a byte search; a line being written meanwhile (no newline yet) is
    newer than anything the caller asks about."""
    needle = canonical_bytes(run_id)
    out: list[dict[str, Any]] = []
    pos = begin
    while True:
        hit = view.find(needle, pos, size)
        if hit == -1:
            return out
        start = view.rfind(b"\n", begin, hit) + 1 or begin
        end = view.find(b"\n", hit, size)
        if end == -1:
            return out
        rec = _loads(view[start:end])
        if isinstance(rec, dict) and rec.get("run_id") == run_id:
            out.append(rec)
        pos = end + 1
