"""The native syncer of group commit: shared fdatasyncs, failures fail closed, no thread outlives close()."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import threading
from pathlib import Path

import pytest

import proctor.audit.log as log_module
from proctor.audit import AuditLog, verify
from proctor.audit.log import NATIVE_GROUP_COMMIT


@pytest.fixture(autouse=True)
def _built() -> None:
    if not NATIVE_GROUP_COMMIT:
        pytest.fail("proctor.audit._syncer is not built: reinstall proctor (pip install -e .) with a C compiler")


def _tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def test_concurrent_durable_appends_share_the_syncers_rounds(tmp_path: Path) -> None:
    """8 threads x 25 durable appends each return once on disk, in fewer fdatasync rounds than appends."""
    path = tmp_path / "audit.jsonl"
    results: list[tuple[int | None, int]] = []  # (seq, bytes on disk when the append returned)
    with AuditLog(path, checkpoint_every=10_000) as log:
        syncer = log._syncer
        assert syncer is not None and syncer.running

        def writer(n: int) -> None:
            for i in range(25):
                result = log.append("call_intent", {"call_id": f"t{n}-{i}", "tool": "x", "run_id": "r"})
                assert result.ok
                results.append((result.seq, syncer.synced))

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rounds = syncer.rounds
    ends = list(itertools.accumulate(len(line) for line in path.read_bytes().splitlines(keepends=True)))
    assert len(results) == 200
    assert all(seq is not None and synced >= ends[seq] for seq, synced in results)
    assert 0 < rounds < 200
    assert verify(path).ok


def test_each_append_returns_after_a_round_that_covers_it(tmp_path: Path) -> None:
    """A lone durable append returns only once the syncer's synced bytes reach the end of its line."""
    with AuditLog(tmp_path / "audit.jsonl") as log:
        for i in range(20):
            assert log.append("call_intent", {"call_id": f"c{i}", "tool": "x", "run_id": "r"}).ok
            assert log._syncer.synced >= log._size


def test_no_thread_outlives_close(tmp_path: Path) -> None:
    """Opening a log starts one native thread; close() ends it, and appends after close are refused."""
    before = _tasks()
    log = AuditLog(tmp_path / "audit.jsonl")
    syncer = log._syncer
    assert _tasks() == before + 1
    assert log.append("call_intent", {"call_id": "c1", "tool": "x", "run_id": "r"}).ok
    log.close()
    assert not syncer.running and _tasks() == before
    assert not log.append("call_intent", {"call_id": "c2", "tool": "x", "run_id": "r"}).ok


def test_a_flush_log_starts_no_syncer(tmp_path: Path) -> None:
    """A log that never fsyncs appends (durability flush) has no syncer thread."""
    with AuditLog(tmp_path / "audit.jsonl", durability="flush") as log:
        assert log._syncer is None


def test_a_failed_fdatasync_fails_every_waiting_append_closed(tmp_path: Path) -> None:
    """When the syncer's fdatasync fails (here EINVAL: a pipe), every waiting append fails with a one-line reason."""
    from proctor.audit._syncer import Syncer

    read_end, write_end = os.pipe()
    try:
        with AuditLog(tmp_path / "audit.jsonl", checkpoint_every=10_000) as log:
            log._syncer.stop()
            log._syncer = Syncer(read_end)  # the real thread, on a descriptor fdatasync refuses
            results: list[str | None] = []

            def writer(n: int) -> None:
                for i in range(3):
                    fields = {"call_id": f"t{n}-{i}", "tool": "x", "run_id": "r"}
                    results.append(log.append("call_intent", fields).error)

            threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            assert not any(t.is_alive() for t in threads)
            assert len(results) == 12 and all(e is not None for e in results)
            assert log.error is not None and "fsync" in log.error and "\n" not in log.error
            assert not log.append("step", {"run_id": "r"}).ok
    finally:
        os.close(read_end)
        os.close(write_end)


def test_waiters_covered_by_the_closing_checkpoint_return_ok(tmp_path: Path) -> None:
    """Appends racing close() either return ok (their line is on disk) or are refused: none hangs, the log verifies."""
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, checkpoint_every=10_000)
    outcomes: list[bool] = []
    started = threading.Barrier(9)

    def writer(n: int) -> None:
        started.wait()
        for i in range(50):
            outcomes.append(log.append("call_intent", {"call_id": f"t{n}-{i}", "tool": "x", "run_id": "r"}).ok)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    started.wait()
    log.close()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert True in outcomes or False in outcomes
    report = verify(path)
    assert report.ok
    on_disk = path.read_bytes().count(b'"kind":"call_intent"')
    assert outcomes.count(True) <= on_disk


def test_every_fsync_of_the_log_is_a_round_of_the_syncer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoints fsync through the syncer too: no two fsyncs of the log overlap (Linux tells one of them an error)."""
    beside: list[int] = []
    real = log_module.sync_fd
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, checkpoint_every=3) as log:
        def noted(fd: int) -> None:
            if fd == log._fd:
                beside.append(fd)
            real(fd)

        monkeypatch.setattr(log_module, "sync_fd", noted)

        def writer(n: int) -> None:
            for i in range(20):
                assert log.append("call_intent", {"call_id": f"t{n}-{i}", "tool": "x", "run_id": "r"}).ok

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert log._syncer.rounds > 0
    assert beside == []
    assert verify(path).ok


def _full_pipe() -> tuple[int, int]:
    """A pipe whose buffer is full, its write end blocking: a write to it sleeps until the read end goes."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(write_end, b"x" * 65536)
    os.set_blocking(write_end, True)
    return read_end, write_end


def test_a_failed_round_of_an_appending_thread_wakes_the_appends_waiting_for_the_next_round(tmp_path: Path) -> None:
    """An append waiting for the round after a failing one (an appending thread's) gets the error, not a hang."""
    from proctor.audit._syncer import Syncer

    fd = os.open(tmp_path / "data", os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    read_end, write_end = _full_pipe()
    syncer = Syncer(fd)
    outcomes: dict[str, object] = {}

    def append(name: str, upto: int) -> None:
        try:
            outcomes[name] = syncer.sync(upto)
        except OSError as exc:
            outcomes[name] = exc.errno

    try:
        # The round's note goes to the full pipe: the first appender's round stays in flight until the pipe's
        # reader closes, and then fails (EPIPE), the way an fdatasync fails after others began to wait.
        syncer.trace(write_end)
        os.write(fd, b"a")
        first = threading.Thread(target=append, args=("first", 1))
        first.start()
        while syncer.rounds < 1:  # the first appender runs round 1 itself (none was in flight)
            first.join(0.001)
        os.write(fd, b"b")
        second = threading.Thread(target=append, args=("second", 2))  # not covered by round 1: waits for round 2
        second.start()
        while syncer.waiting < 1:
            second.join(0.001)
        os.close(read_end)
        read_end = -1
        first.join(timeout=60)
        second.join(timeout=60)
        hung = second.is_alive()
        syncer.stop()  # wakes a hung waiter, so a failure here leaves no thread behind
        second.join(timeout=60)
        assert not hung, "an append waiting for the next round slept on after the round before it failed"
        assert outcomes == {"first": errno.EPIPE, "second": errno.EPIPE}
        assert not syncer.running
        with pytest.raises(OSError):
            syncer.sync(2)
    finally:
        if read_end >= 0:  # first: a round blocked on the pipe holds stop() until then
            os.close(read_end)
        syncer.stop()
        os.close(fd)
        os.close(write_end)


def test_stop_from_many_threads_at_once_joins_the_thread_once(tmp_path: Path) -> None:
    """stop() called by 8 threads at once (the GIL is released in it) returns in each, with the thread ended."""
    from proctor.audit._syncer import Syncer

    fd = os.open(tmp_path / "data", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        for _ in range(50):
            syncer = Syncer(fd)
            start = threading.Barrier(8)

            def stop(s: Syncer = syncer, b: threading.Barrier = start) -> None:
                b.wait()
                s.stop()

            threads = [threading.Thread(target=stop) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            assert not any(t.is_alive() for t in threads)
            assert not syncer.running
            assert syncer.sync(1) is False  # stopped: never on disk through it
    finally:
        os.close(fd)
