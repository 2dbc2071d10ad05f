"""Pure-Python group commit: concurrent durable appends share fsyncs, none returns before its record is on disk."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

import proctor.audit.log as log_module
from proctor.audit import AuditLog, verify


def test_concurrent_durable_appends_share_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """8 threads x 25 durable appends need far fewer fsyncs than appends, each covering its record."""
    covered: list[int] = []
    real = log_module.sync_fd

    def slow_sync(fd: int) -> None:
        size = os.fstat(fd).st_size
        time.sleep(0.002)  # a disk's fsync: long enough for other threads to queue behind it
        real(fd)
        covered.append(size)

    monkeypatch.setattr(log_module, "sync_fd", slow_sync)
    path = tmp_path / "audit.jsonl"
    late: list[int] = []
    with AuditLog(path, checkpoint_every=10_000) as log:

        def writer(n: int) -> None:
            for i in range(25):
                result = log.append("call_intent", {"call_id": f"t{n}-{i}", "tool": "x", "run_id": "r"})
                assert result.ok
                size_after = log._size  # at least this record's end is written; it must be covered now
                if max(covered, default=0) < min(size_after, _end_of(path, result.seq)):
                    late.append(result.seq or 0)

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        appended = log.seq
    assert late == []
    assert appended == 200
    assert len(covered) < 200 // 2, f"{len(covered)} fsyncs for 200 durable appends"
    assert verify(path).ok


def test_a_failed_fsync_fails_every_waiting_append_and_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the shared fsync fails, the append waiting on it is not ok and the log takes no more records."""
    def broken_sync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    with AuditLog(tmp_path / "audit.jsonl") as log:
        monkeypatch.setattr(log_module, "sync_fd", broken_sync)
        result = log.append("call_intent", {"call_id": "c1", "tool": "x", "run_id": "r"})
        assert not result.ok and "fsync" in (result.error or "")
        assert not log.append("call_intent", {"call_id": "c2", "tool": "x", "run_id": "r"}, durable=False).ok
        monkeypatch.undo()


def _end_of(path: Path, seq: int | None) -> int:
    offset = 0
    with open(path, "rb") as f:
        for n, line in enumerate(f):
            offset += len(line)
            if n == seq:
                return offset
    return offset


def test_a_failed_shared_fsync_wakes_every_follower_with_the_error(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Followers queued behind an fsync that fails all return not ok (none hangs), and the log takes no more."""
    calls: list[int] = []
    real = log_module.sync_fd

    def failing_second(fd: int) -> None:
        calls.append(fd)
        time.sleep(0.005)  # long enough for the other threads to queue as followers
        if len(calls) >= 2:
            raise OSError(5, "Input/output error")
        real(fd)

    results: dict[int, list[bool]] = {n: [] for n in range(8)}
    with AuditLog(tmp_path / "audit.jsonl", checkpoint_every=10_000) as log:
        monkeypatch.setattr(log_module, "sync_fd", failing_second)

        def writer(n: int) -> None:
            for i in range(5):
                results[n].append(log.append("call_intent", {"call_id": f"t{n}-{i}", "tool": "x", "run_id": "r"}).ok)

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
        assert log.error is not None and "fsync" in log.error
        # A thread's second append comes after the first fsync, so each met the failure; none was ok after it.
        for oks in results.values():
            assert len(oks) == 5 and False in oks and True not in oks[oks.index(False):]
        assert not log.append("step", {"run_id": "r"}).ok
        monkeypatch.undo()


def test_followers_finish_when_checkpoints_fsync_under_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a checkpoint every 3 records, their fsyncs cover followers (even one chosen to lead): no append hangs."""
    real = log_module.sync_fd
    rng = random.Random(7)

    def jittery_sync(fd: int) -> None:
        time.sleep(rng.uniform(0, 0.002))
        real(fd)

    monkeypatch.setattr(log_module, "sync_fd", jittery_sync)
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, checkpoint_every=3) as log:

        def writer(n: int) -> None:
            for i in range(40):
                assert log.append("call_intent", {"call_id": f"t{n}-{i}", "tool": "x", "run_id": "r"}).ok
                assert log.append("call_outcome", {"call_id": f"t{n}-{i}", "status": "ok", "run_id": "r"},
                                  durable=False).ok

        threads = [threading.Thread(target=writer, args=(n,), daemon=True) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
    report = verify(path)
    assert report.ok and report.dangling_intents == []
