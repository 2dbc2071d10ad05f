"""What a shadow policy adds to a governed call: `Gate(policy, shadow=candidate)` against `Gate(policy)`.

Run: `.venv/bin/python bench/shadow.py [--calls N] [--rounds R]`. Side by side in one run, rounds
interleaved so that load on the machine falls on both alike: an allowed read call with the in-memory
audit sink through a gate without a shadow, with a shadow that agrees (the candidate is a copy with
one more conditional rule), and with one that disagrees on every call (each writes a
`shadow_decision` record); each as `gate.call` from the host (the gate alone: the harshest
ratio) and as a program's call from the sandboxed worker with an audit file (a governed call
as an agent makes it), the tool answering at once; and that program's call again with a tool whose
answer takes 1 ms (`time.sleep`: a service on the same host), what a program calling tools that do
some work feels.

Two figures, as the shadow decides a call once it is answered (`proctor.gate.shadow`): the latency
a program's call sees (wall time per call of a program's loop of calls: the shadow's work overlaps
the program's own as long as the host has a core to do it on), and the CPU the shadow costs
(`gate.call`'s CPU time per call, where nothing overlaps). Target (issue 32): the agreeing shadow
adds <= 10 % to the latency of a program's governed call, read on the tool that answers at once.

`--instructions` counts the CPU figure instead under callgrind (instructions per `gate.call`, each
subject in its own process: deterministic on a loaded machine; needs valgrind, its headers and a C
compiler).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
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


@tool(side_effect="read", name="get_weather")
def get_weather_from_a_service(city: str) -> str:
    """Weather for a city, from a service on the same host (its answer takes 1 ms).

    Args:
        city: City name.
    """
    time.sleep(0.001)
    return "sunny"


def per_call_us(gate: Gate, calls: int) -> tuple[float, float]:
    """gate.call straight from the host: the gate's own cost, nothing else (wall and CPU µs a call)."""
    ctx = gate.start_run()
    start, cpu = time.perf_counter_ns(), time.process_time_ns()
    for _ in range(calls):
        gate.call("get_weather", {"city": "Paris"}, context=ctx)
    return (time.perf_counter_ns() - start) / calls / 1000, (time.process_time_ns() - cpu) / calls / 1000


def program_per_call_us(gate: Gate, calls: int) -> tuple[float, float]:
    """A governed call as an agent's program makes it: from a sandboxed worker, through the gate (wall µs a
    call; no CPU figure: the host's wait for the worker's next call may spin)."""
    tool_ = next(iter(gate.tools.values()))
    with Interpreter(tools=[tool_], gate=gate, sandbox="auto", timeout=600) as py:
        py.run("get_weather('Paris')")  # the worker is up
        start = time.perf_counter_ns()
        result = py.run(f"for _ in range({calls}):\n    get_weather('Paris')")
        elapsed = time.perf_counter_ns() - start
        assert result.error is None, result.error
    return elapsed / calls / 1000, float("nan")


HELPER = r"""
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void cg_stop(void) { CALLGRIND_DUMP_STATS; CALLGRIND_STOP_INSTRUMENTATION; }
"""
SHADOWS = {"no shadow": None, "shadow that agrees": AGREEING, "shadow that disagrees": DISAGREEING}


def counted_calls(name: str, calls: int) -> None:
    """The subject `name` under callgrind: 300 calls to warm up, then `calls` counted (`--instructions`)."""
    import ctypes
    import gc
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    helper = ctypes.CDLL(os.environ["CG_HELPER"])
    candidate = SHADOWS[name]
    gate = Gate(Policy.from_dict(ENFORCED), audit=InMemoryAudit(), tools=[get_weather],
                shadow=Policy.from_dict(candidate) if candidate is not None else None)
    ctx = gate.start_run()
    for _ in range(300):
        gate.call("get_weather", {"city": "Paris"}, context=ctx)
    gc.collect()
    gc.freeze()
    helper.cg_start()
    for _ in range(calls):
        gate.call("get_weather", {"city": "Paris"}, context=ctx)
    helper.cg_stop()


def instructions(calls: int) -> int:
    """Instructions per gate.call of each subject, counted by callgrind in a process of its own."""
    if shutil.which("valgrind") is None or shutil.which("cc") is None:
        print("--instructions needs valgrind, its headers (valgrind/callgrind.h) and a C compiler", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="proctor-shadow-") as tmp:
        helper, source = os.path.join(tmp, "cgctl.so"), os.path.join(tmp, "cgctl.c")
        Path(source).write_text(HELPER)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", helper, source], check=True)
        counts: dict[str, float] = {}
        for i, name in enumerate(SHADOWS):
            out = os.path.join(tmp, f"cg{i}")
            subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}.%p",
                            sys.executable, os.path.abspath(__file__), "--counted", name, "--calls", str(calls)],
                           env={**os.environ, "CG_HELPER": helper, "PYTHONHASHSEED": "0"}, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=3600)
            dumps = [f for f in os.listdir(tmp) if f.startswith(f"cg{i}.") and f.endswith(".1")]
            text = Path(tmp, dumps[0]).read_text()
            found = re.search(r"^summary: (\d+)$", text, re.M)
            assert found is not None, "callgrind wrote no summary"
            counts[name] = int(found.group(1)) / calls
    base = counts["no shadow"]
    print(f"{'gate.call, in-memory audit':32} {'instructions/call':>18} {'x no shadow':>12}")
    for name, count in counts.items():
        print(f"  {name:30} {count / 1000:17.1f}k {count / base:12.3f}")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--instructions", action="store_true", help="count gate.call's instructions (callgrind)")
    parser.add_argument("--counted", choices=SHADOWS, help=argparse.SUPPRESS)  # one subject, under callgrind
    args = parser.parse_args()
    if args.counted:
        counted_calls(args.counted, args.calls)
        return
    if args.instructions:
        sys.exit(instructions(min(args.calls, 2_000)))
    enforced = Policy.from_dict(ENFORCED)
    shadows = {"no shadow": None, "shadow that agrees": Policy.from_dict(AGREEING),
               "shadow that disagrees": Policy.from_dict(DISAGREEING)}
    with tempfile.TemporaryDirectory() as tmp:
        def audit_file() -> AuditLog:  # the intent of a read call flushed, not fsynced (`read_durability: flush`)
            return AuditLog(Path(tmp) / f"{time.perf_counter_ns()}.jsonl", durability="flush")

        rows: dict[str, tuple[Callable[[], Any], Callable[[Gate, int], tuple[float, float]], Any, int]] = {
            "gate.call, in-memory audit": (InMemoryAudit, per_call_us, get_weather, args.calls),
            "program call, audit file": (audit_file, program_per_call_us, get_weather, args.calls),
            # What a user's program feels with a tool that does some work: the same, the tool's answer taking 1 ms.
            "program call, a 1 ms tool": (audit_file, program_per_call_us, get_weather_from_a_service,
                                          max(args.calls // 10, 200)),
        }
        verdicts: list[str] = []
        for row_name, (sink, measure, tool_, calls) in rows.items():
            def make(candidate: Policy | None, sink: Callable[[], Any] = sink, tool_: Any = tool_) -> Gate:
                return Gate(enforced, audit=sink(), tools=[tool_], shadow=candidate)

            for candidate in shadows.values():  # warm up every path
                measure(make(candidate), min(500, calls))
            wall: dict[str, list[float]] = {name: [] for name in shadows}
            cpu: dict[str, list[float]] = {name: [] for name in shadows}
            for _ in range(args.rounds):
                for name, candidate in shadows.items():
                    w, c = measure(make(candidate), calls)
                    wall[name].append(w)
                    cpu[name].append(c)
            base, base_cpu = statistics.median(wall["no shadow"]), statistics.median(cpu["no shadow"])
            timed_cpu = base_cpu == base_cpu  # (nan where the row has no CPU figure)
            print(f"{row_name:32} {'wall µs/call':>13} {'x no shadow':>12}"
                  + (f" {'CPU µs/call':>12} {'x no shadow':>12}" if timed_cpu else ""))
            for name in shadows:
                w, c = statistics.median(wall[name]), statistics.median(cpu[name])
                cpu_cells = f" {c:12.2f} {c / base_cpu:12.3f}" if timed_cpu else ""
                print(f"  {name:30} {w:13.2f} {w / base:12.3f}{cpu_cells}")
            agree = statistics.median(wall["shadow that agrees"]) / base
            if timed_cpu:
                extra = statistics.median(cpu["shadow that agrees"]) - base_cpu
                verdicts.append(f"CPU the agreeing shadow costs: +{extra:.1f} µs a call "
                                f"({statistics.median(cpu['shadow that agrees']) / base_cpu:.3f}x gate.call's)")
            elif tool_ is get_weather:
                verdicts.append(f"latency of a program's call with the agreeing shadow: {agree:.3f}x "
                                f"(target <= 1.10x): {'met' if agree <= 1.10 else 'NOT met'}")
            else:
                verdicts.append(f"the same with a tool whose answer takes 1 ms: {agree:.3f}x")
            print()
        print("\n".join(verdicts))


if __name__ == "__main__":
    main()
