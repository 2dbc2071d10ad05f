"""A governed call's cost as its run grows: call #10 against #1,000 and #10,000 (issues #18.1, #34.6).

Each subject is one policy whose deciding rule reads the run's history in a common form:
``history.exists(...)``, ``size(history.filter(...))``, a ``map()`` then ``exists()``, and
``size(history)`` (folded per run), and the keyed forms that compare an entry with the call's
``args`` — ``exists``/``all``/``exists_one``/``size(filter())`` (the demo's "no refund twice") —
served by the run's keyed indices (`proctor.policy.aggregates.KeyedFold`). For each, one gate
(no audit sink, like `bench/gate_call.py`) runs a read-only warm-up to fill its run to N calls,
then times `gate.call` of the conditional tool (each call adds an entry, so the next decision
folds it in: the real per-call cost) at
N = 10, 1,000 and 10,000, in rounds so that the sizes are measured side by side.

"as written" repeats one decision at each N evaluating the original condition over the
whole history (what every decision cost before the per-run folds), to show the curve the
folds remove; it is skipped past 1,000 calls for map(), which the `cel` package makes
quadratic (see docs/cel-upstream-map.md).

"decide(), indexed" times `Policy.decide` alone at #10 and #10,000 through the run's folds and
indices (the gate's own path, without the rest of a call), best of 50.

Run: .venv/bin/python bench/history.py [--rounds 3] [--calls 400]
Target: call #10,000 costs <= 2x call #10 for every subject.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from proctor import Gate, Policy, tool
from proctor.calls import Call
from proctor.policy.activation import Activation
from proctor.policy.projection import needs_of

SUBJECTS = {
    "exists()": "history.exists(h, h.tool == 'read_secret')",
    "size(filter())": "size(history.filter(h, h.tool == 'send_email')) > 1000000",
    "map().exists()": "history.map(h, h.tool).exists(t, t == 'read_secret')",
    "size(history)": "size(history) > 1000000",
    "exists() by args": "history.exists(h, h.tool == 'send_email' && h.args.to == args.to)",
    "all() by args": "!history.all(h, h.tool != 'send_email' || h.args.to != args.to)",
    "exists_one() by args": "history.exists_one(h, h.tool == 'send_email' && h.args.to == args.to)",
    "count by args": "size(history.filter(h, h.tool == 'send_email' && h.args.to == args.to)) > 1000000",
}
SIZES = (10, 1_000, 10_000)


@tool(side_effect="read")
def get_weather(city: str) -> str:
    """Weather.

    Args:
        city: A city.
    """
    return "sunny"


@tool(side_effect="external")
def send_email(to: str) -> str:
    """Send.

    Args:
        to: Recipient.
    """
    return "sent"


def policy_for(condition: str) -> Policy:
    return Policy.from_dict({"version": 1, "rules": [
        {"name": "reads", "match": {"side_effect": "read"}, "decision": "allow"},
        {"name": "mail", "match": {"tool": "send_email"}, "decision": "allow"},
        {"name": "history-rule", "match": {"tool": "send_email"}, "when": condition, "decision": "deny"},
    ]})


def per_call_us(condition: str, size: int, calls: int) -> float:
    """Median µs of gate.call(send_email) once the run holds `size` earlier calls."""
    gate = Gate(policy_for(condition), tools=[get_weather, send_email])
    ctx = gate.start_run()
    for _ in range(size):
        gate.call("get_weather", {"city": "x"}, context=ctx)
    times = []
    for i in range(calls):
        to = f"u{i}@example.com"  # a new address each call: the keyed rules allow it, so the call runs
        began = time.perf_counter_ns()
        gate.call("send_email", {"to": to}, context=ctx)
        times.append(time.perf_counter_ns() - began)
    return statistics.median(times) / 1000


def as_written_us(condition: str, size: int) -> float:
    """µs of one decision evaluating the original condition over the whole history."""
    policy = policy_for(condition)
    gate = Gate(policy, tools=[get_weather, send_email], history_limit=max(size, 1))
    ctx = gate.start_run()
    for _ in range(size):
        gate.call("get_weather", {"city": "x"}, context=ctx)
    (rule,) = [r for r in policy.compiled if r.condition is not None]
    assert rule.condition is not None
    call = Call("send_email", {"to": "new@example.com"}, "external", history=ctx.history_view(), run=ctx.info)
    reps = 3 if size >= 1000 else 50
    best = float("inf")
    for _ in range(reps):
        began = time.perf_counter_ns()
        needs = needs_of(rule.condition.source, rule.condition.variables)
        rule.condition.program.execute(Activation(call, "external", needs).cel_context(rule.condition.variables))
        best = min(best, time.perf_counter_ns() - began)
    return best / 1000


def indexed_us(condition: str, size: int) -> float:
    """µs of one decision of the rule through the run's folds and indices (what the gate does), best of a few."""
    policy = policy_for(condition)
    gate = Gate(policy, tools=[get_weather, send_email])
    ctx = gate.start_run()
    for _ in range(size):
        gate.call("get_weather", {"city": "x"}, context=ctx)
    call = Call("send_email", {"to": "new@example.com"}, "external", history=ctx.history_view(), run=ctx.info)
    best = float("inf")
    for _ in range(50):
        began = time.perf_counter_ns()
        policy.decide(call)
        best = min(best, time.perf_counter_ns() - began)
    return best / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=400)
    opts = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; {opts.rounds} rounds of {opts.calls} calls at each size")
    results: dict[str, dict[int, list[float]]] = {name: {n: [] for n in SIZES} for name in SUBJECTS}
    for _ in range(opts.rounds):
        for name, condition in SUBJECTS.items():
            for size in SIZES:
                results[name][size].append(per_call_us(condition, size, opts.calls))
    print(f"\n{'gate.call p50, µs':<22}" + "".join(f"{'#' + format(n, ','):>10}" for n in SIZES)
          + f"{'#10,000 / #10':>16}  {'decide(), indexed #10 / #10,000':>34}"
          + f"  {'as written at #10 / #1,000 / #10,000':>40}")
    worst = 0.0
    for name, condition in SUBJECTS.items():
        med = {n: statistics.median(results[name][n]) for n in SIZES}
        ratio = med[10_000] / med[10]
        worst = max(worst, ratio)
        written = [as_written_us(condition, n) if n <= 1000 or "map" not in name else float("nan") for n in SIZES]
        indexed = (indexed_us(condition, 10), indexed_us(condition, 10_000))
        print(f"{name:<22}" + "".join(f"{med[n]:>10.1f}" for n in SIZES) + f"{ratio:>15.2f}x  "
              + f"{f'{indexed[0]:,.1f} / {indexed[1]:,.1f} µs ({indexed[1] / indexed[0]:.2f}x)':>34}  "
              + f"{' / '.join(f'{w:,.0f}' for w in written):>40} µs")
    print(f"\nworst ratio #10,000 / #10: {worst:.2f}x (target <= 2x); load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
