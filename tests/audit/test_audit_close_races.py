"""Red team: close() while durable appends are in flight, and what a closed log leaves running behind it."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from proctor.audit import AuditLog, verify


def _helpers() -> set[threading.Thread]:
    return set(threading.enumerate())


def _children() -> set[int]:
    """Pids of this process's live children (a syncer process would be one)."""
    me = os.getpid()
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == me and fields[0] != "Z":
            found.add(int(entry))
    return found


def _close_during_appends(path: Path, round_: int) -> None:
    """One round: 8 threads append, close() comes while they do; check what the log holds."""
    log = AuditLog(path, checkpoint_every=7)
    acknowledged: list[str] = []
    refused: list[str] = []
    lock = threading.Lock()
    started = threading.Barrier(9)

    def append(t: int) -> None:
        started.wait()
        for i in range(400):
            call_id = f"{round_}-{t}-{i}"
            r = log.append("call_intent", {"call_id": call_id, "run_id": "r", "tool": "t", "args": {}})
            with lock:
                (acknowledged if r.ok else refused).append(call_id)
            if not r.ok:
                return

    writers = [threading.Thread(target=append, args=(t,)) for t in range(8)]
    for w in writers:
        w.start()
    started.wait()
    pause = threading.Event()
    while True:  # close once some appends went through, while the others are in flight
        with lock:
            if len(acknowledged) >= 20:
                break
        pause.wait(0.001)
    closer = threading.Thread(target=log.close)
    closer.start()
    closer.join(timeout=60)
    assert not closer.is_alive(), "close() hung while appends were in flight"
    for w in writers:
        w.join(timeout=60)
    assert not any(w.is_alive() for w in writers), "an append hung across close()"
    assert refused, "close() came after every append: the race was not exercised"
    report = verify(path)
    assert report.ok, report.failure
    on_disk = {r.get("call_id") for r in map(json.loads, path.read_bytes().splitlines())}
    missing = sorted(set(acknowledged) - on_disk)
    assert missing == [], f"acknowledged but not in the log: {missing[:5]}"
    assert log.append("step", {"run_id": "r"}).ok is False


def test_close_during_durable_appends_loses_nothing_acknowledged_and_leaves_nothing_running(tmp_path: Path) -> None:
    """8 threads append while close() runs: each append returns, every acknowledged record is in the verified log."""
    path = tmp_path / "audit.jsonl"
    threads_before, children_before = _helpers(), _children()
    for round_ in range(5):
        _close_during_appends(path, round_)
    leftover = {t for t in _helpers() - threads_before if t.is_alive()}
    assert not leftover, f"threads left running after close(): {[t.name for t in leftover]}"
    assert _children() - children_before == set(), "processes left running after close()"
