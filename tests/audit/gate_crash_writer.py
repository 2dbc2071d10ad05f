"""Crash harness for test_gate_crash: threads call a side-effecting tool through a real Gate and file AuditLog; SIGKILL.

Usage: python gate_crash_writer.py WORKDIR RUNS SEED THREADS

Each run forks a child that opens the audit log (recovering what the last kill left) and a Gate, then
runs THREADS threads, each its own run, calling `effect` (side_effect write: its intent must be durable
before it runs) and `peek` (a read) in a loop. The tool notes ``E <token>`` in an events file before it
acts, and every completed fsync/fdatasync of the process is noted as ``S <bytes of the log on disk>``
(os.fsync and os.fdatasync are wrapped in the child, whatever code calls them). The parent SIGKILLs the
child a random 0-40 ms after its first effect. Prints one JSON summary line.
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

from proctor.audit import AuditLog
from proctor.gate import Gate
from proctor.policy import Policy
from proctor.tools import tool

POLICY = """
version: 1
default: allow
tools:
  effect: {side_effect: write}
  peek: {side_effect: read}
"""


def child(work: Path, run: int, ready_fd: int, threads: int) -> None:
    events = os.open(work / "events.txt", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    log_path = work / "audit.jsonl"
    log_fd: list[int] = []

    def noted(real):  # type: ignore[no-untyped-def]
        def sync(fd: int) -> None:
            size = os.fstat(fd).st_size if log_fd and os.path.sameopenfile(fd, log_fd[0]) else -1
            real(fd)
            if size >= 0:
                os.write(events, f"S {size}\n".encode())
        return sync

    os.fsync, os.fdatasync = noted(os.fsync), noted(os.fdatasync)  # type: ignore[assignment]
    log_fd.append(os.open(log_path, os.O_RDONLY | os.O_CREAT, 0o600))

    @tool(side_effect="write")
    def effect(token: str) -> str:
        """Change the world.

        Args:
            token: What to write.
        """
        os.write(events, f"E {token}\n".encode())
        return "done"

    @tool(side_effect="read")
    def peek(token: str) -> str:
        """Look.

        Args:
            token: What to look at.
        """
        return token

    log = AuditLog(log_path, checkpoint_every=40)
    gate = Gate(Policy.from_string(POLICY), audit=log, tools=[effect, peek])
    os.write(ready_fd, b"r")

    def worker(t: int) -> None:
        ctx = gate.start_run(task=f"run {run} thread {t}")
        i = 0
        while True:
            gate.submit("effect", {"token": f"r{run}t{t}c{i}"}, context=ctx)
            gate.submit("peek", {"token": f"p{run}t{t}c{i}"}, context=ctx)
            i += 1

    for t in range(1, threads):
        threading.Thread(target=worker, args=(t,), daemon=True).start()
    worker(0)


def _wait_for_an_effect(events: Path, seen: int, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if events.exists():
            with events.open("rb") as f:
                f.seek(seen)
                if b"E " in f.read():
                    return
        time.sleep(0.002)


def main() -> None:
    work, runs, seed, threads = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(seed)
    problems: list[str] = []
    events = work / "events.txt"
    for run in range(runs):
        seen = events.stat().st_size if events.exists() else 0
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns
            os.close(r)
            try:
                child(work, run, w, threads)
            finally:
                os._exit(4)
        os.close(w)
        ready, _, _ = select.select([r], [], [], 20)
        if not ready:
            problems.append(f"run {run}: child never opened the log")
        _wait_for_an_effect(events, seen, 20)  # on a loaded machine the child may take a while to start working
        time.sleep(rng.uniform(0, 0.04))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(r)
        if os.WIFEXITED(status):
            problems.append(f"run {run}: child exited with {os.WEXITSTATUS(status)} instead of being killed")
    print(json.dumps({"runs": runs, "problems": problems}))


if __name__ == "__main__":
    main()
