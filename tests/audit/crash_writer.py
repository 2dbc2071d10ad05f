"""Crash harness for test_audit_crash: fork writers and SIGKILL them at random points.

Usage: python crash_writer.py WORKDIR RUNS SEED LOGS [THREADS]

Each run forks a child that opens one of LOGS audit logs (recovering what the last kill
left), then loops: append a durable `call_intent`, perform the "tool" (append the call
id to an effects file), append the `call_outcome`. The parent kills it with SIGKILL
after a random 0-30 ms (usually counted from the child's "log open" signal, sometimes
from the fork, so kills land inside recovery too), then verifies the log as it was
left. Every other round of runs writes each line in two pieces (see `_split_write`) so that kills tear
lines the way a power cut can. Prints one JSON summary line. Imports happen once, before any fork, so a run
costs milliseconds rather than an interpreter start.

With THREADS > 1 each child runs that many writer threads on one log, so durable appends
share fsyncs (group commit), and every fsync that completes and every effect is noted, in
order, in an events file per log (``S <bytes on disk>`` / ``E <call id>``): the test checks
that each effect came after an fsync covering its intent's line.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import sys
import threading
import time
from pathlib import Path

import proctor.audit.log as audit_log_module
from proctor.audit import AuditLog, verify


def _split_write(fd: int, data: bytes) -> None:
    # One write() of a short line is never cut by SIGKILL; a power cut can tear it. Writing
    # each line in two pieces with a pause makes kills land mid-line, so recovery is exercised.
    half = len(data) // 2
    os.write(fd, data[:half])
    time.sleep(0.0005)
    os.write(fd, data[half:])


def child(log_path: Path, effects: Path, run: int, ready_fd: int, split: bool, threads: int = 1) -> None:
    if split:
        audit_log_module.write_all = _split_write
    events = -1
    if threads > 1:
        events = os.open(str(effects) + ".events", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        real_sync = audit_log_module.sync_fd

        def noted_sync(fd: int) -> None:
            size = os.fstat(fd).st_size  # what this fsync covers, at least
            real_sync(fd)
            os.write(events, f"S {size}\n".encode())

        audit_log_module.sync_fd = noted_sync
    log = AuditLog(log_path, durability="fsync", checkpoint_every=25)
    os.write(ready_fd, b"r")
    fd = os.open(effects, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def writer(name: str) -> None:
        i = 0
        while True:
            call_id = f"r{run}-{name}c{i}"
            if not log.append("call_intent", {"call_id": call_id, "tool": "effect", "run_id": f"r{run}"}).ok:
                os._exit(3)
            if events >= 0:
                os.write(events, f"E {call_id}\n".encode())
            os.write(fd, (call_id + "\n").encode())  # the tool runs only after its intent is durable
            log.append("call_outcome", {"call_id": call_id, "status": "ok", "run_id": f"r{run}"})
            i += 1

    for t in range(1, threads):
        threading.Thread(target=writer, args=(f"t{t}",), daemon=True).start()
    writer("t0")


def main() -> None:
    work, runs, seed, logs = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    threads = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    rng = random.Random(seed)
    torn = clean = 0
    problems: list[str] = []
    for run in range(runs):
        n = run % logs
        log_path, effects = work / f"log{n}.jsonl", work / f"effects{n}.txt"
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns
            os.close(r)
            try:
                child(log_path, effects, run, w, split=(run // logs) % 2 == 1, threads=threads)
            finally:
                os._exit(4)
        os.close(w)
        if rng.random() < 0.85:
            ready, _, _ = select.select([r], [], [], 10)
            if not ready:
                problems.append(f"run {run}: child never opened the log")
        time.sleep(rng.uniform(0, 0.03))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(r)
        if os.WIFEXITED(status):
            problems.append(f"run {run}: child exited with {os.WEXITSTATUS(status)} instead of being killed")
        if log_path.exists():
            report = verify(log_path)
            if report.ok:
                clean += 1
            elif report.failure is not None and report.failure.code == "PARSE" and "torn" in report.failure.message:
                torn += 1  # a kill mid-append; the next open must recover it
            else:
                problems.append(f"run {run}: {report.failure}")
    print(json.dumps({"runs": runs, "torn": torn, "clean": clean, "problems": problems}))


if __name__ == "__main__":
    main()
