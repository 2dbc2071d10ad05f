"""Overhead of `Gate.call` for an allowed read-only call, against calling the function directly.

Run by hand: `.venv/bin/python bench/gate_call.py`. Measures, side by side in one run:
the bare function call, and gate.call through a realistic policy with the in-memory
audit sink (and with no sink). Target: gate overhead ≤ 30 µs at p50.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from proctor.gate import Gate
from proctor.policy import Policy
from proctor.testing import InMemoryAudit
from proctor.tools import tool

POLICY = {
    "version": 1,
    "tools": {"get_weather": {"side_effect": "read"}},
    "budgets": [{"name": "run-calls", "limit": {"calls": 10_000_000}}],
    "rules": [
        {"name": "reads", "match": {"side_effect": ["none", "read"]}, "decision": "allow"},
        {"name": "internal-mail", "match": {"tool": "send_email"},
         "when": "args.to.endsWith('@example.com')", "decision": "allow"},
        {"name": "no-exfiltration", "match": {"side_effect": ["external", "destructive"]},
         "when": "history.exists(c, c.tool == 'read_secret')", "decision": "deny"},
    ],
}


@tool
def get_weather(city: str) -> str:
    """Weather for a city.

    Args:
        city: City name.
    """
    return "sunny"


def one_call(gate: Gate) -> Callable[[], object]:
    """An allowed call through `gate`, in a run of its own."""
    ctx = gate.start_run()
    return lambda: gate.call("get_weather", {"city": "Paris"}, context=ctx)


def measure(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t) / 1000)
    return out


def pct(xs: list[float], p: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(len(xs) * p))]


def main(n: int = 20_000) -> None:
    policy = Policy.from_dict(POLICY)
    rows = []
    direct = measure(lambda: get_weather.fn("Paris"), n)
    rows.append(("direct call", direct))
    for label, audit in (("gate.call, no audit sink", None), ("gate.call, in-memory audit", InMemoryAudit())):
        gate = Gate(policy, audit=audit, tools=[get_weather])
        measure(one_call(gate), 2000)  # warm up
        rows.append((label, measure(one_call(gate), n)))  # a fresh run: history starts empty, as in a step
    base = statistics.median(direct)
    print(f"{'':32} {'p50 µs':>8} {'p99 µs':>8} {'overhead p50 µs':>16}")
    for label, xs in rows:
        print(f"{label:32} {pct(xs, .5):8.1f} {pct(xs, .99):8.1f} {pct(xs, .5) - base:16.1f}")


if __name__ == "__main__":
    main()
