"""From `proctor halt` returning to the last of 8 processes' gates refusing (issue #32.1), on Redis and PostgreSQL.

Eight worker processes each run a real `Gate` whose halt channel is the backend's (`RedisHalts`
on a real redis-server, `StoreHalts` on a real PostgreSQL run store) and call `gate.call(
"send_email", …)` in a loop (one call a millisecond: a busy agent's pace; the policy allows the
call and the tool does nothing), reporting the moment the answer changes: the call ran, or
it was refused with ``halted by <id>``. Each trial runs the real
command, `proctor halt --tool send_email --reason … --audit LOG` (in this process, through
`proctor.cli.main`), notes when it returned, and waits for all 8 workers to see the halt;
then lifts it (`proctor halt --lift`) and waits for all 8 to see it gone.

Run: .venv/bin/python bench/halt.py [--trials 40]
Target: p99 of (last gate refusing - command returned) <= 1 s, each backend.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing as mp
import queue as queue_mod
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fleet_engines import PostgresServer, RedisServer

from proctor.cli import main as proctor

WORKERS = 8
TARGET_S = 1.0


POLICY = {"version": 1, "rules": [{"name": "mail", "match": {"tool": "send_email"}, "decision": "allow"}]}


def send_email(to: str) -> str:
    """Send an email (does nothing here: the bench times the gate's refusal, not a tool).

    Args:
        to: Recipient.
    """
    return "sent"


def worker(kind: str, url: str, index: int, out: Any, stop: Any) -> None:
    from proctor.errors import ToolDenied
    from proctor.gate import Gate
    from proctor.policy import Policy
    from proctor.tools import tool

    if kind == "redis":
        from proctor.halt.redis import RedisHalts

        channel: Any = RedisHalts(url)
    else:
        from proctor.halt.sql import StoreHalts

        channel = StoreHalts(url)
    gate = Gate(Policy.from_dict(POLICY), tools=[tool(side_effect="external")(send_email)], halts=channel)
    ctx = gate.start_run(principal="alice", agent="mailer", run_id=f"run_{index}")
    last: str | None = "start"
    try:
        while not stop.is_set():
            try:
                gate.call("send_email", {"to": "ops@example.com"}, context=ctx)
                seen = None
            except ToolDenied as exc:
                text = str(exc)
                if "halted by " not in text:
                    raise
                seen = text.split("halted by ", 1)[1].split(":", 1)[0]
            now = time.time_ns()
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


def measure(kind: str, url: str, backend: list[str], trials: int, audit: Path) -> tuple[list[float], list[float]]:
    """Per trial: seconds from the command returning to the last gate refusing (0 when they all refused
    before it returned: it writes the audit record after the halt), and from the halt's own timestamp."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    stop = ctx.Event()
    procs = [ctx.Process(target=worker, args=(kind, url, i, queue, stop), daemon=True) for i in range(WORKERS)]
    for p in procs:
        p.start()
    state: dict[int, tuple[str | None, int]] = {}
    latencies, from_set = [], []
    try:
        _wait_all(queue, None, state, timeout_s=60)  # every worker has a first snapshot: no halt
        for _ in range(trials):
            out = _run(["halt", "--tool", "send_email", "--reason", "bench", *backend, "--audit", str(audit)])
            returned = time.time_ns()
            halt_id = out.split()[-1]
            last = _wait_all(queue, halt_id, state)
            latencies.append(max(0, last - returned) / 1e9)
            (listed,) = json.loads(_run(["halt", "--list", "--json", *backend]))
            from_set.append((last - listed["at_ns"]) / 1e9)
            _run(["halt", "--lift", halt_id, "--reason", "bench over", *backend, "--audit", str(audit)])
            _wait_all(queue, None, state)
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=10)
    return latencies, from_set


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    opts = parser.parse_args()
    results: dict[str, tuple[list[float], list[float]]] = {}
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
    for name, (values, since_set) in results.items():
        p99 = _p99(values)
        ok = ok and p99 <= TARGET_S
        median = statistics.median(values) * 1000
        print(f"{name:>10}: {WORKERS} processes' gates, {len(values)} halts: from `proctor halt` returning: "
              f"median {median:.0f} ms, p99 {p99 * 1000:.0f} ms, max {max(values) * 1000:.0f} ms = "
              f"{p99 / TARGET_S:.2f}x the {TARGET_S:g} s target; from the halt's timestamp: median "
              f"{statistics.median(since_set) * 1000:.0f} ms, p99 {_p99(since_set) * 1000:.0f} ms")
    print("target met" if ok else "TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
