"""Red team: Linux reports a writeback error to ONE fsync of a file description ("fsyncgate").

Two fsyncs of the log's descriptor that overlap (a group-commit leader's, and a checkpoint's taken
under the log's mutex meanwhile) both wait for the same failed writeback, but only the first to check
gets EIO; the other returns 0 although the bytes it was asked to cover are lost. So an append whose
fsync overlapped a failed one must not be acknowledged: its intent may not be on disk, and the gate
would run the tool. The kernel's order is forced here by holding the leader's fsync until the
checkpoint's has failed (the leader's then really fsyncs, and succeeds, as the kernel would let it).
"""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest

import proctor.audit.log as log_module
from proctor.audit import AuditLog


def test_an_append_whose_fsync_overlapped_a_failed_checkpoint_fsync_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint's fsync gets the EIO; the leader's, in flight over the same bytes, must fail its append too."""
    log = AuditLog(tmp_path / "audit.jsonl")
    real = log_module.sync_fd
    leader_in_fsync, checkpoint_failed = threading.Event(), threading.Event()

    def kernel(fd: int) -> None:
        if threading.current_thread().name == "appender":
            leader_in_fsync.set()
            checkpoint_failed.wait(2)  # (fsyncs no longer overlap: the checkpoint waits for this one)
            real(fd)  # ... so this one sees none: it returns 0
            return
        raise OSError(errno.EIO, "Input/output error")  # the checkpoint's fsync is the one told

    monkeypatch.setattr(log_module, "sync_fd", kernel)
    result = {}
    appender = threading.Thread(name="appender", target=lambda: result.update(
        r=log.append("call_intent", {"call_id": "c1", "run_id": "r", "tool": "pay", "args": {}})))
    appender.start()
    assert leader_in_fsync.wait(30)
    assert not log.checkpoint().ok  # under the mutex, while the leader's fsync is in flight
    checkpoint_failed.set()
    appender.join(30)
    assert not appender.is_alive()
    assert log.error is not None
    assert not result["r"].ok, "acknowledged an intent whose writeback failed: the gate would run the tool"
