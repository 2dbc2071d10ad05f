"""Reserve + settle through a RedisLedger on loopback Redis: latency and round trips per call.

Run by hand: `.venv/bin/python bench/fleet_redis.py [CALLS]`. Starts its own redis-server
(append-only, fsync every second — the docs/fleet.md setting) on a free loopback TCP port
and measures, one call at a time, a reserve and a settle of a global budget, p50 and p99.
Round trips are counted on the server (INFO commandstats: scripts run per call). Also
shown side by side: a bare Redis PING (the floor of one round trip) and the in-memory
ledger. Targets (issue #17): ≤ 2 round trips a call, p50 ≤ 150 µs. The machine's load
average is printed with the figures: on a shared 2-core VM the absolute numbers move.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fleet"))
import redis
from fleet_engines import RedisServer

from proctor.ledger import Claim, MemoryLedger
from proctor.ledger.redis import RedisLedger

CLAIM = Claim(key="bench|global|w=0", budget="bench", calls=10**9, cost=10.0**12, scope="for all runs")


def _percentiles(samples: list[int]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2] / 1000, ordered[int(len(ordered) * 0.99)] / 1000


def _scripts_run(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    print(f"load average before: {os.getloadavg()[0]:.2f} (cpus: {os.cpu_count()})")
    with tempfile.TemporaryDirectory() as root:
        server = RedisServer(Path(root), tcp=True)
        server.start()
        try:
            client = redis.Redis.from_url(server.tcp_url)
            client.config_set("appendfsync", "everysec")
            ledger = RedisLedger(server.tcp_url)
            for _ in range(200):  # warm up: scripts loaded, connection open
                ledger.settle(ledger.reserve([CLAIM], 1), duration_ns=1)
            ping: list[int] = []
            for _ in range(calls):
                t = time.perf_counter_ns()
                client.ping()
                ping.append(time.perf_counter_ns() - t)
            before = _scripts_run(client)
            pair: list[int] = []
            for _ in range(calls):
                t = time.perf_counter_ns()
                lease = ledger.reserve([CLAIM], 1, tool="bench")
                ledger.settle(lease, duration_ns=1000)
                pair.append(time.perf_counter_ns() - t)
            trips = (_scripts_run(client) - before) / calls
            ledger.close()
            client.close()
        finally:
            server.stop()
    memory = MemoryLedger()
    mem: list[int] = []
    for _ in range(calls):
        t = time.perf_counter_ns()
        memory.settle(memory.reserve([CLAIM], 1), duration_ns=1000)
        mem.append(time.perf_counter_ns() - t)
    p50, p99 = _percentiles(pair)
    f50, f99 = _percentiles(ping)
    m50, m99 = _percentiles(mem)
    print(f"calls: {calls}")
    print(f"redis PING (one round trip)        p50 {f50:7.1f} µs   p99 {f99:7.1f} µs")
    print(f"RedisLedger reserve+settle          p50 {p50:7.1f} µs   p99 {p99:7.1f} µs   "
          f"round trips/call {trips:.2f}   ({p50 / f50:.1f}x a PING)")
    print(f"MemoryLedger reserve+settle         p50 {m50:7.1f} µs   p99 {m99:7.1f} µs")
    print(f"targets: <= 2 round trips/call: {'met' if trips <= 2 else 'MISSED'}; "
          f"p50 <= 150 µs: {'met' if p50 <= 150 else 'MISSED'}")
    print(f"mean {statistics.fmean(pair) / 1000:.1f} µs; load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
