"""Reserve + settle through a RedisLedger on loopback Redis: latency beside the floor, round trips per call.

Run by hand: `.venv/bin/python bench/fleet_redis.py [CALLS] [--rounds R] [--baseline REV]…
[--appendfsync everysec|always|no]`. Starts its own redis-server (append-only; fsync every
second unless told otherwise — `always` puts an AOF fsync in every write's answer) on a free
loopback TCP port and a Unix socket, and measures one call at a time, p50 and p99:

- the floor: a RESP PING written and read on a raw socket (one round trip, nothing else),
  and a raw HINCRBY (one write: Redis appends it to its AOF before it answers);
- a PING through redis-py's client (what a round trip costs through the library);
- `RedisLedger` reserve, settle, and reserve + settle of a global budget, back to back,
  over TCP and over the Unix socket;
- with `--baseline REV` (repeatable), the same through the `RedisLedger` of git revision
  REV (its `proctor/ledger/redis.py` and `redis_wire.py`), for before/after ratios.

The kinds are interleaved, R rounds of CALLS/R each, so a busy neighbour slows them all
alike. Round trips per call are counted twice, outside the timed loops: on the client
(commands whose reply it waited for, and commands written without waiting — a settle,
whose reply is read with the next command) and on the server (INFO commandstats: scripts
run). The load average is printed with the figures: on a shared VM compare the ratios,
not the µs. Targets (issue #17): ≤ 2 round trips a call, p50 ≤ 150 µs.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import redis
from fleet_engines import RedisServer

from proctor.ledger import Claim, MemoryLedger, redis_wire
from proctor.ledger.redis import RedisLedger

ROOT = Path(__file__).resolve().parents[1]

CLAIM = Claim(key="bench|global|w=0", budget="bench", calls=10**9, cost=10.0**12, scope="for all runs")
PING = b"*1\r\n$4\r\nPING\r\n"
WRITE = b"*4\r\n$7\r\nHINCRBY\r\n$11\r\nbench:floor\r\n$1\r\nn\r\n$1\r\n1\r\n"


def _pct(samples: list[int]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2] / 1000, ordered[int(len(ordered) * 0.99)] / 1000


def _raw(address: tuple[str, int] | str, message: bytes = PING) -> Callable[[], None]:
    """One command (PING) on a raw blocking socket, reading until the whole reply is in."""
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.connect(address)
    if family == socket.AF_INET:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def ping() -> None:
        sock.sendall(message)
        got = sock.recv(64)
        while not got.endswith(b"\r\n"):
            got += sock.recv(64)

    return ping


def _baseline(rev: str, n: int) -> ModuleType:
    """The redis ledger module as it was at `rev`, with its wire of `rev` too (other imports: today's tree)."""
    def source(path: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"],
                              capture_output=True, text=True, check=True).stdout

    folder = Path(tempfile.mkdtemp(prefix="proctor-bench-"))
    modules = {}
    wire, ledger = f"proctor_redis_wire_baseline{n}", f"proctor_redis_baseline{n}"
    for name, path in ((wire, "proctor/ledger/redis_wire.py"), (ledger, "proctor/ledger/redis.py")):
        text = source(path).replace("from proctor.ledger.redis_wire import", f"from {wire} import")
        (folder / f"{name}.py").write_text(text)
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = modules[name] = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return modules[ledger]


def _pair(ledger: Any, reserve: list[int], settle: list[int], pair: list[int], n: int) -> None:
    for _ in range(n):
        t0 = time.perf_counter_ns()
        lease = ledger.reserve([CLAIM], 1, tool="bench")
        t1 = time.perf_counter_ns()
        ledger.settle(lease, duration_ns=1000)
        t2 = time.perf_counter_ns()
        reserve.append(t1 - t0)
        settle.append(t2 - t1)
        pair.append(t2 - t0)


def _scripts_run(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))


def _client_round_trips(ledger: RedisLedger, calls: int) -> tuple[float, float]:
    """Per reserve + settle: commands whose reply the ledger waited for, and commands it wrote
    without waiting (their replies read with a later command) — counted around its wire, untimed."""
    waited, unwaited = [0], [0]
    real_call, real_send = redis_wire.Wire.call, redis_wire.Wire.send

    def call(self: redis_wire.Wire, packed: bytes) -> Any:
        waited[0] += 1
        return real_call(self, packed)

    def send(self: redis_wire.Wire, script: redis_wire.Script, count: int, tail: bytes, note: Any) -> None:
        unwaited[0] += 1
        return real_send(self, script, count, tail, note)

    redis_wire.Wire.call, redis_wire.Wire.send = call, send  # type: ignore[method-assign]
    try:
        for _ in range(calls):
            ledger.settle(ledger.reserve([CLAIM], 1), duration_ns=1000)
    finally:
        redis_wire.Wire.call, redis_wire.Wire.send = real_call, real_send  # type: ignore[method-assign]
    return waited[0] / calls, unwaited[0] / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("calls", nargs="?", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--appendfsync", default="everysec", choices=("everysec", "always", "no"),
                        help="Redis's AOF fsync policy (docs/fleet.md: always for no lost counts, everysec)")
    parser.add_argument("--baseline", metavar="REV", action="append", default=[],
                        help="also measure the RedisLedger of this git revision (repeatable)")
    opts = parser.parse_args()
    per_round = max(1, opts.calls // opts.rounds)
    print(f"load average before: {os.getloadavg()[0]:.2f} (cpus: {os.cpu_count()}); hiredis: "
          f"{redis.utils.HIREDIS_AVAILABLE}; redis-py {redis.__version__}")
    rows: dict[str, list[int]] = {}

    def row(name: str) -> list[int]:
        return rows.setdefault(name, [])

    with tempfile.TemporaryDirectory() as root:
        server = RedisServer(Path(root), tcp=True)
        server.start()
        try:
            client = redis.Redis.from_url(server.tcp_url)
            client.config_set("appendfsync", opts.appendfsync)
            version = client.info("server")["redis_version"]
            raw_tcp, raw_unix = _raw(("127.0.0.1", server.port)), _raw(str(server.socket))
            raw_write = _raw(("127.0.0.1", server.port), WRITE)
            ledgers: dict[str, Any] = {"tcp": RedisLedger(server.tcp_url), "unix": RedisLedger(server.url)}
            for n, rev in enumerate(opts.baseline):
                old = _baseline(rev, n)
                ledgers[f"tcp, {rev}"] = old.RedisLedger(server.tcp_url, prefix=f"baseline{n}")
                ledgers[f"unix, {rev}"] = old.RedisLedger(server.url, prefix=f"baseline{n}u")
            for ledger in ledgers.values():
                for _ in range(300):  # warm up: scripts loaded, connections open
                    ledger.settle(ledger.reserve([CLAIM], 1), duration_ns=1)
            for _ in range(opts.rounds):
                for name, ping in (("raw PING, tcp", raw_tcp), ("raw PING, unix", raw_unix),
                                   ("raw HINCRBY (a write), tcp", raw_write), ("redis-py PING, tcp", client.ping)):
                    samples = row(name)
                    for _ in range(per_round):
                        t = time.perf_counter_ns()
                        ping()
                        samples.append(time.perf_counter_ns() - t)
                for name, ledger in ledgers.items():
                    _pair(ledger, row(f"reserve, {name}"), row(f"settle, {name}"),
                          row(f"reserve+settle, {name}"), per_round)
            before = _scripts_run(client)
            client_trips = _client_round_trips(ledgers["tcp"], 1000)
            server_trips = (_scripts_run(client) - before) / 1000
            for ledger in ledgers.values():
                ledger.close()
            client.close()
        finally:
            server.stop()
    memory = MemoryLedger()
    _pair(memory, row("reserve, memory"), row("settle, memory"), row("reserve+settle, memory"), opts.calls)
    floor = _pct(rows["raw PING, tcp"])[0]
    print(f"Redis {version} on loopback, appendonly yes, appendfsync {opts.appendfsync}; "
          f"{opts.rounds} rounds x {per_round} calls per kind, interleaved")
    print(f"{'':32s} {'p50 µs':>8s} {'p99 µs':>8s}  p50 / raw TCP PING")
    for name, samples in rows.items():
        p50, p99 = _pct(samples)
        print(f"{name:32s} {p50:8.1f} {p99:8.1f}  {p50 / floor:5.2f}x")
    pair50 = _pct(rows["reserve+settle, tcp"])[0]
    print(f"round trips per reserve+settle: {client_trips[0]:.2f} replies waited for + {client_trips[1]:.2f} "
          f"commands written without waiting (client), {server_trips:.2f} scripts run (server)")
    print(f"targets: <= 2 round trips/call: {'met' if max(sum(client_trips), server_trips) <= 2 else 'MISSED'}; "
          f"p50 <= 150 µs (tcp): {'met' if pair50 <= 150 else 'MISSED'} ({pair50:.1f} µs = "
          f"{pair50 / (2 * floor):.2f}x two raw round trips)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
