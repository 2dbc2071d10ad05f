"""What a shadow policy adds to a governed call: `Gate(policy, shadow=candidate)` against `Gate(policy)`.

Run: `.venv/bin/python bench/shadow.py [--calls N] [--rounds R]`. Side by side in one run, rounds
interleaved so that load on the machine falls on both alike: an allowed read call with the in-memory
audit sink through a gate without a shadow, with a shadow that agrees (the candidate is a copy with
one more conditional rule), and with one that disagrees on every call (each writes a
`shadow_decision` record); each as `gate.call` from the host (the gate alone: the harshest
ratio) and as a program's call from the sandboxed worker with an audit file (a governed call
as an agent makes it). Target (issue 32): the agreeing shadow adds <= 10 % to a governed call.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proctor.audit.log import AuditLog
from proctor.gate import Gate
from proctor.interpreter import Interpreter
from proctor.policy import Policy
from proctor.testing import InMemoryAudit
from proctor.tools import tool

ENFORCED: dict[str, Any] = {
    "version": 1,
    "budgets": [{"name": "run-calls", "limit": {"calls": 100_000_000}}],
    "rules": [
        {"name": "reads", "match": {"side_effect": ["none", "read"]}, "decision": "allow"},
        {"name": "no-exfiltration", "match": {"side_effect": ["external", "destructive"]},
         "when": "history.exists(c, c.tool == 'read_secret')", "decision": "deny"},
    ],
}
AGREEING: dict[str, Any] = {**ENFORCED, "rules": [
    *ENFORCED["rules"],
    {"name": "no-paris-on-sunday", "match": {"tool": "get_weather"}, "when": "args.city == 'Atlantis'",
     "decision": "deny"},
]}
DISAGREEING: dict[str, Any] = {**ENFORCED, "rules": [
    {"name": "weather-needs-a-human", "match": {"tool": "get_weather"}, "decision": "require_approval"},
    *ENFORCED["rules"],
]}


@tool(side_effect="read")
def get_weather(city: str) -> str:
    """Weather for a city.

    Args:
        city: City name.
    """
    return "sunny"


def per_call_us(gate: Gate, calls: int) -> float:
    """gate.call straight from the host: the gate's own cost, nothing else."""
    ctx = gate.start_run()
    start = time.perf_counter_ns()
    for _ in range(calls):
        gate.call("get_weather", {"city": "Paris"}, context=ctx)
    return (time.perf_counter_ns() - start) / calls / 1000


def program_per_call_us(gate: Gate, calls: int) -> float:
    """A governed call as an agent's program makes it: from a sandboxed worker, through the gate."""
    with Interpreter(tools=[get_weather], gate=gate, sandbox="auto", timeout=600) as py:
        py.run("get_weather('Paris')")  # the worker is up
        start = time.perf_counter_ns()
        result = py.run(f"for _ in range({calls}):\n    get_weather('Paris')")
        elapsed = time.perf_counter_ns() - start
        assert result.error is None, result.error
    return elapsed / calls / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    enforced = Policy.from_dict(ENFORCED)
    shadows = {"no shadow": None, "shadow that agrees": Policy.from_dict(AGREEING),
               "shadow that disagrees": Policy.from_dict(DISAGREEING)}
    with tempfile.TemporaryDirectory() as tmp:
        rows: dict[str, tuple[Callable[[], Any], Callable[[Gate, int], float]]] = {
            "gate.call, in-memory audit": (InMemoryAudit, per_call_us),
            # the intent of a read call flushed, not fsynced (`read_durability: flush`)
            "program call, audit file": (
                lambda: AuditLog(Path(tmp) / f"{time.perf_counter_ns()}.jsonl", durability="flush"),
                program_per_call_us),
        }
        for row_name, (sink, measure) in rows.items():
            def make(candidate: Policy | None, sink: Callable[[], Any] = sink) -> Gate:
                return Gate(enforced, audit=sink(), tools=[get_weather], shadow=candidate)

            for candidate in shadows.values():  # warm up every path
                measure(make(candidate), 500)
            times: dict[str, list[float]] = {name: [] for name in shadows}
            for _ in range(args.rounds):
                for name, candidate in shadows.items():
                    times[name].append(measure(make(candidate), args.calls))
            base = statistics.median(times["no shadow"])
            print(f"{row_name:32} {'µs/call (median)':>17} {'x no shadow':>12}")
            for name, xs in times.items():
                print(f"  {name:30} {statistics.median(xs):17.2f} {statistics.median(xs) / base:12.3f}")
            ratio = statistics.median(times["shadow that agrees"]) / base
            print(f"  shadow that agrees: {ratio:.3f}x (target <= 1.10x): {'met' if ratio <= 1.10 else 'NOT met'}\n")


if __name__ == "__main__":
    main()
