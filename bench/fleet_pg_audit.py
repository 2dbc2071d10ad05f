"""Durable audit intents per second into PostgreSQL with 1, 8 and 32 concurrent writers.

Run by hand: `.venv/bin/python bench/fleet_pg_audit.py [SECONDS]`. Starts its own
PostgreSQL 15 (as `nobody`, fsync on, synchronous_commit on — durable on commit) and
appends `call_intent` records with `durable=True` (each append returns only after its
commit is flushed) from N threads sharing one `PostgresAuditLog` (group commit inside the
process), and from N processes with one writer each (group commit by PostgreSQL across
processes). Prints intents/s and the p50/p99 latency of one append; the chain is verified
at the end. Target (issue #17): ≥ 5,000 durable intents/s at 8 writers. The load average
is printed with the figures (a shared 2-core VM: compare the rows, not other machines).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fleet"))
from fleet_engines import PostgresServer

from proctor.audit.postgres import PostgresAuditLog, verify_postgres

FIELDS = {"run_id": "run_bench", "tool": "send_email", "side_effect": "external", "decision": "allow",
          "args": {"to": "bob@example.com", "subject": "hello"}, "rules": ["internal-mail"],
          "policy_sha256": "a" * 64}


def _threads(log: PostgresAuditLog, writers: int, seconds: float) -> tuple[int, list[int]]:
    stop = time.monotonic() + seconds
    counts = [0] * writers
    latencies: list[int] = []

    def write(i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            t = time.perf_counter_ns()
            result = log.append("call_intent", {**FIELDS, "call_id": f"t{i}-{n}"}, durable=True)
            latencies.append(time.perf_counter_ns() - t)
            if not result.ok:
                raise SystemExit(result.error)
            n += 1
        counts[i] = n

    workers = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts), latencies


def _process(url: str, seconds: float, start: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    with PostgresAuditLog(url, checkpoint_every=100_000) as log:
        while time.time() < start:
            time.sleep(0.001)
        count, latencies = _threads(log, 1, seconds)
    out.put((count, latencies))


def _pct(samples: list[int]) -> str:
    s = sorted(samples)
    return f"p50 {s[len(s) // 2] / 1000:8.0f} µs  p99 {s[int(len(s) * 0.99)] / 1000:8.0f} µs"


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 4.0
    server = PostgresServer()
    server.start()
    try:
        print(f"PostgreSQL 15, fsync=on, synchronous_commit=on; load average {os.getloadavg()[0]:.2f} "
              f"(cpus {os.cpu_count()}); {seconds:g}s per row")
        for writers in (1, 8, 32):
            url = f"{server.url}&log=threads{writers}"
            with PostgresAuditLog(url, checkpoint_every=100_000) as log:
                count, latencies = _threads(log, writers, seconds)
            report = verify_postgres(url)
            print(f"{writers:3d} writer threads, one process:  {count / seconds:8.0f} durable intents/s  "
                  f"{_pct(latencies)}  "
                  f"verify {'ok' if report.ok else report.failure}  load {os.getloadavg()[0]:.2f}")
        ctx = mp.get_context("spawn")
        for writers in (1, 8):
            url = f"{server.url}&log=procs{writers}"
            PostgresAuditLog(url).close()
            queue: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
            start = time.time() + 3 + writers * 0.5  # every process connected before the clock starts
            procs = [ctx.Process(target=_process, args=(url, seconds, start, queue)) for _ in range(writers)]
            for p in procs:
                p.start()
            results = [queue.get(timeout=300) for _ in procs]
            for p in procs:
                p.join()
            count = sum(c for c, _ in results)
            latencies = [x for _, lat in results for x in lat]
            report = verify_postgres(url)
            print(f"{writers:3d} writer processes, one each:   {count / seconds:8.0f} durable intents/s  "
                  f"{_pct(latencies)}  verify {'ok' if report.ok else report.failure}  "
                  f"load {os.getloadavg()[0]:.2f}")
        print("target: >= 5,000 durable intents/s at 8 writers; a durable intent costs a WAL flush shared by "
              "the intents committed together, so the ceiling is (flushes/s of the disk) x (intents per flush): "
              "measure the disk with /usr/lib/postgresql/15/bin/pg_test_fsync")
    finally:
        server.cleanup()


if __name__ == "__main__":
    main()
