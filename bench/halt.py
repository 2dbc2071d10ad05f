"""From `proctor halt` returning to the last of 8 processes refusing (issue #32.1), on Redis and PostgreSQL.

Eight worker processes each hold a halt channel of the backend (`RedisHalts` on a real
redis-server, `StoreHalts` on a real PostgreSQL run store) and call `channel.check(...)` —
what a gate calls after admission for every call — in a loop (one check a millisecond:
a busy gate's pace), reporting the moment the answer changes. Each trial runs the real
command, `proctor halt --tool send_email --reason … --audit LOG` (in this process, through
`proctor.cli.main`), notes when it returned, and waits for all 8 workers to see the halt;
then lifts it (`proctor halt --lift`) and waits for all 8 to see it gone.

Run: .venv/bin/python bench/halt.py [--trials 40]
Target: p99 of (last worker refusing - command returned) <= 1 s, each backend.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing as mp
import queue as queue_mod
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fleet"))
from fleet_engines import PostgresServer, RedisServer

from proctor.cli import main as proctor

WORKERS = 8
TARGET_S = 1.0


def worker(kind: str, url: str, index: int, out: Any, stop: Any) -> None:
    if kind == "redis":
        from proctor.halt.redis import RedisHalts

        channel: Any = RedisHalts(url)
    else:
        from proctor.halt.sql import StoreHalts

        channel = StoreHalts(url)
    last: str | None = "start"
    try:
        while not stop.is_set():
            halt = channel.check("send_email", "mailer", "alice", f"run_{index}")
            now = time.time_ns()
            seen = halt.id if halt is not None else None
            if seen != last:
                out.put((index, seen, now))
                last = seen
            time.sleep(0.001)
    finally:
        channel.close()


def _run(argv: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = proctor(argv)
    if code != 0:
        raise SystemExit(f"proctor {' '.join(argv)} exited {code}")
    return buf.getvalue()


def _wait_all(queue: Any, want: str | None, state: dict[int, tuple[str | None, int]], timeout_s: float = 10) -> int:
    """Until every worker's last report is `want`; the latest time any of them reported it."""
    deadline = time.monotonic() + timeout_s
    while not all(state.get(i, ("?", 0))[0] == want for i in range(WORKERS)):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SystemExit(f"workers did not all see {want!r} within {timeout_s}s: {state}")
        try:
            index, seen, at = queue.get(timeout=remaining)
        except queue_mod.Empty:  # the deadline check above reports it
            continue
        state[index] = (seen, at)
    return max(at for _, at in state.values())


def measure(kind: str, url: str, backend: list[str], trials: int, audit: Path) -> list[float]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    stop = ctx.Event()
    procs = [ctx.Process(target=worker, args=(kind, url, i, queue, stop), daemon=True) for i in range(WORKERS)]
    for p in procs:
        p.start()
    state: dict[int, tuple[str | None, int]] = {}
    latencies = []
    try:
        _wait_all(queue, None, state, timeout_s=60)  # every worker has a first snapshot: no halt
        for _ in range(trials):
            out = _run(["halt", "--tool", "send_email", "--reason", "bench", *backend, "--audit", str(audit)])
            returned = time.time_ns()
            halt_id = out.split()[-1]
            last = _wait_all(queue, halt_id, state)
            latencies.append(max(0, last - returned) / 1e9)
            _run(["halt", "--lift", halt_id, "--reason", "bench over", *backend, "--audit", str(audit)])
            _wait_all(queue, None, state)
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=10)
    return latencies


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    opts = parser.parse_args()
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="proctor-bench-halt-") as tmp:
        root = Path(tmp)
        redis_server = RedisServer(root / "redis")
        (root / "redis").mkdir()
        redis_server.start()
        pg = PostgresServer()
        try:
            results["redis"] = measure("redis", redis_server.url, ["--ledger", redis_server.url], opts.trials,
                                       root / "audit-redis.jsonl")
            pg.start()
            results["postgresql"] = measure("store", pg.url, ["--store", pg.url], opts.trials,
                                            root / "audit-pg.jsonl")
        finally:
            redis_server.stop()
            pg.cleanup()
    ok = True
    for name, values in results.items():
        p99 = _p99(values)
        ok = ok and p99 <= TARGET_S
        median = statistics.median(values) * 1000
        print(f"{name:>10}: {WORKERS} processes, {len(values)} halts: median {median:.0f} ms, "
              f"p99 {p99 * 1000:.0f} ms, max {max(values) * 1000:.0f} ms = {p99 / TARGET_S:.2f}x the "
              f"{TARGET_S:g} s target")
    print("target met" if ok else "TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
