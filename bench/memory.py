"""Host memory in the number of calls (issue #18.2): after 1e4 calls against after 1e6.

One `Interpreter` (one worker, one host) runs programs of `--per-program` allowed read calls
(with an in-memory-free gate: no audit sink, as `bench/gate_call.py`), in two ways:

- **default context**: every program belongs to the Interpreter's one run (its history grows);
- **fresh contexts**: each program gets a new run from `gate.start_run()`.

The host's resident set (VmRSS, and the Python heap as `tracemalloc` does not see C
allocations) is read after 1e4 calls and again after `--calls` (1e6 by default); the target is
a difference within 10 MB. A policy with a history condition is used so the run's folds work too.

Run: .venv/bin/python bench/memory.py [--calls 1000000] [--per-program 10000] [--sandbox process]
[--in-process] (gate.call in this process: the gate and its runs without the channel, much faster)
"""

from __future__ import annotations

import argparse
import gc
import os
import time

from proctor import Gate, Interpreter, Policy, tool


@tool(side_effect="read")
def lookup(order: str) -> str:
    """Look an order up.

    Args:
        order: Order id.
    """
    return "shipped"


POLICY = {"version": 1, "rules": [
    {"name": "reads", "match": {"side_effect": "read"}, "decision": "allow"},
    {"name": "no-secrets-then-reads", "match": {"tool": "lookup"},
     "when": "history.exists(h, h.tool == 'read_secret') && size(history) > 1000000000", "decision": "deny"},
]}


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def measure(fresh: bool, calls: int, per_program: int, sandbox: str) -> tuple[float, float, float]:
    gate = Gate(Policy.from_dict(POLICY), tools=[lookup])
    program = f"for i in range({per_program}):\n    lookup('A-{{}}'.format(i))\n"
    marks: dict[int, float] = {}
    began = time.perf_counter()
    with Interpreter([lookup], gate, sandbox=sandbox, timeout=3600) as py:  # type: ignore[arg-type]
        done = 0
        while done < calls:
            r = py.run(program, context=gate.start_run() if fresh else None)
            assert r.error is None, r.error
            done += per_program
            del r
            if done in (10_000, calls):
                gc.collect()
                marks[done] = rss_mb()
    return marks[10_000], marks[calls], time.perf_counter() - began


def measure_in_process(fresh: bool, calls: int, per_program: int) -> tuple[float, float, float]:
    """The same calls through `gate.call` in this process (no worker): the gate and its runs alone."""
    gate = Gate(Policy.from_dict(POLICY), tools=[lookup])
    ctx = gate.start_run()
    marks: dict[int, float] = {}
    began = time.perf_counter()
    for done in range(1, calls + 1):
        if fresh and done % per_program == 1:
            ctx = gate.start_run()
        gate.call("lookup", {"order": "A-1"}, context=ctx)
        if done in (10_000, calls):
            gc.collect()
            marks[done] = rss_mb()
    return marks[10_000], marks[calls], time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--per-program", type=int, default=10_000)
    parser.add_argument("--sandbox", default="process")
    parser.add_argument("--in-process", action="store_true", help="gate.call in this process, no Interpreter")
    opts = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; {opts.calls:,} calls in programs of {opts.per_program:,}")
    for fresh in (False, True):
        at_1e4, at_end, seconds = (measure_in_process(fresh, opts.calls, opts.per_program) if opts.in_process
                                   else measure(fresh, opts.calls, opts.per_program, opts.sandbox))
        label = "fresh contexts " if fresh else "default context"
        print(f"{label}: host RSS {at_1e4:7.1f} MB after 1e4 calls, {at_end:7.1f} MB after {opts.calls:.0e} "
              f"-> {at_end - at_1e4:+6.1f} MB (target within 10 MB); {seconds:.0f} s")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
