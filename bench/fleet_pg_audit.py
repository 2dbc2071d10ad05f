"""Durable audit intents per second into PostgreSQL with 1, 8 and 32 concurrent writers.

Run by hand: `.venv/bin/python bench/fleet_pg_audit.py [SECONDS] [--tmpfs] [--set NAME=VALUE]…`.
Starts its own PostgreSQL 15 (as `nobody`, fsync on, synchronous_commit on — durable on
commit) and appends `call_intent` records with `durable=True` (each append returns only
after its commit is flushed) from N threads sharing one `PostgresAuditLog` (group commit
inside the process) and from N processes with one writer each (group commit by
PostgreSQL across processes). Each row: intents/s, p50/p99 of one append, and what the
server counted meanwhile (pg_stat_wal, pg_stat_database): WAL flushes, intents carried
by one flush, transactions per intent; and the CPU time an intent cost, in the writers'
processes and in PostgreSQL's (from /proc), with what two idle cores would then carry —
the software's bound, whatever the neighbours do. The chain is verified after each row.

The disk's own flush rate is measured first (pg_test_fsync, fdatasync of one 8 kB write,
in the cluster's directory): N writers that each wait for their intent to be durable
before the next can never exceed N x that rate. `--tmpfs` runs the same on a cluster in
/dev/shm, where a flush costs nothing: that row shows the software's bound, not
durability. `--set` passes settings to the cluster (e.g. commit_delay=200). The load
average is printed with the figures (a shared 2-core VM: compare rows, not machines).
Target (issue #17): ≥ 5,000 durable intents/s at 8 writers.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import psycopg
from fleet_engines import PG_BIN, PostgresServer

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
        cpu = time.process_time()
        count, latencies = _threads(log, 1, seconds)
        cpu = time.process_time() - cpu
    out.put((count, latencies, cpu))


def _pct(samples: list[int]) -> str:
    s = sorted(samples)
    return f"p50 {s[len(s) // 2] / 1000:7.0f} µs  p99 {s[int(len(s) * 0.99)] / 1000:7.0f} µs"


def _fsync_rate(directory: Path) -> float:
    """fdatasync of one 8 kB write per second on `directory`'s file system (PostgreSQL's WAL default)."""
    done = subprocess.run([str(PG_BIN / "pg_test_fsync"), "-s", "2", "-f", str(directory / "pg_test_fsync.out")],
                          capture_output=True, text=True, timeout=120, check=True)
    match = re.search(r"^\s*fdatasync\s+([\d.]+) ops/sec", done.stdout, re.M)
    if match is None:
        raise RuntimeError(f"cannot read pg_test_fsync's output: {done.stdout[-500:]}")
    return float(match.group(1))


def _server_cpu(server: PostgresServer) -> float:
    """CPU seconds used by the cluster: the postmaster, its live children and those it has reaped."""
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    ticks = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile: the postmaster has its time now
        if int(entry) == postmaster:
            ticks += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
        elif int(fields[1]) == postmaster:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _counters(server: PostgresServer) -> tuple[float, ...]:
    """(WAL flushes, committed transactions, server CPU s) so far."""
    with psycopg.connect(server.url, autocommit=True) as conn:
        row = conn.execute("SELECT (SELECT wal_sync FROM pg_stat_wal), "
                           "(SELECT sum(xact_commit) FROM pg_stat_database)").fetchone()
    assert row is not None
    return float(row[0]), float(row[1]), _server_cpu(server)


def _row(label: str, server: PostgresServer, url: str, seconds: float, count: int, latencies: list[int],
         client_cpu: float, before: tuple[float, ...]) -> None:
    time.sleep(0.5)  # the writers' backends have exited: their statistics are in
    flushes, commits, server_cpu = (a - b for a, b in zip(_counters(server), before, strict=True))
    report = verify_postgres(url)
    cpu = (client_cpu + server_cpu) / max(count, 1)
    print(f"{label:34s} {count / seconds:6.0f} intents/s  {_pct(latencies)}  "
          f"{flushes / seconds:4.0f} flushes/s  {count / max(flushes, 1):5.1f} intents/flush  "
          f"{commits / max(count, 1):4.2f} commits/intent  CPU/intent {client_cpu / max(count, 1) * 1e6:4.0f} µs "
          f"client + {server_cpu / max(count, 1) * 1e6:4.0f} µs server (2 idle cores: {2 / max(cpu, 1e-9):6.0f}/s)  "
          f"verify {'ok' if report.ok else report.failure}  load {os.getloadavg()[0]:.1f}")


def _run(server: PostgresServer, where: str, seconds: float, threads: tuple[int, ...], procs: tuple[int, ...]) -> None:
    rate = _fsync_rate(server.root)
    print(f"\n{where}: pg_test_fsync fdatasync {rate:.0f}/s, so N writers waiting each for its own intent "
          f"are bound by N x {rate:.0f}/s ({8 * rate:.0f}/s at 8)")
    for writers in threads:
        url = f"{server.url}&log=threads{writers}"
        with PostgresAuditLog(url, checkpoint_every=100_000) as log:
            before = _counters(server)
            cpu = time.process_time()
            count, latencies = _threads(log, writers, seconds)
            cpu = time.process_time() - cpu
        _row(f"{writers:3d} writer threads, one process", server, url, seconds, count, latencies, cpu, before)
    ctx = mp.get_context("spawn")
    for writers in procs:
        url = f"{server.url}&log=procs{writers}"
        PostgresAuditLog(url).close()
        queue: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
        start = time.time() + 3 + writers * 0.5  # every process connected before the clock starts
        workers = [ctx.Process(target=_process, args=(url, seconds, start, queue)) for _ in range(writers)]
        for p in workers:
            p.start()
        while time.time() < start:
            time.sleep(0.001)
        before = _counters(server)
        results = [queue.get(timeout=300) for _ in workers]
        for p in workers:
            p.join()
        _row(f"{writers:3d} writer processes, one each", server, url, seconds, sum(c for c, _, _ in results),
             [x for _, lat, _ in results for x in lat], sum(c for _, _, c in results), before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("seconds", nargs="?", type=float, default=4.0)
    parser.add_argument("--tmpfs", action="store_true", help="also run on a cluster in /dev/shm (not durable)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a cluster setting")
    parser.add_argument("--threads", default="1,8,32", help="writer thread counts (default 1,8,32)")
    parser.add_argument("--procs", default="1,8,32", help="writer process counts (default 1,8,32)")
    opts = parser.parse_args()
    settings = dict(s.split("=", 1) for s in opts.set)
    threads = tuple(int(n) for n in opts.threads.split(",") if n)
    procs = tuple(int(n) for n in opts.procs.split(",") if n)
    print(f"PostgreSQL 15, fsync=on, synchronous_commit=on {settings or ''}; load average "
          f"{os.getloadavg()[0]:.2f} (cpus {os.cpu_count()}); {opts.seconds:g}s per row")
    places = [("disk (the cluster in /tmp)", None)]
    if opts.tmpfs:
        places.append(("tmpfs (/dev/shm: the software's bound, NOT durable)", Path("/dev/shm")))
    for where, parent in places:
        server = PostgresServer(parent, settings)
        server.start()
        try:
            _run(server, where, opts.seconds, threads, procs)
        finally:
            server.cleanup()
    print("\ntarget: >= 5,000 durable intents/s at 8 writers")


if __name__ == "__main__":
    main()
