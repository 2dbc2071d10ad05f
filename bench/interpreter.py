"""Benchmark: proctor's Interpreter side by side with smolagents' LocalPythonExecutor.

    .venv/bin/python bench/interpreter.py [--markdown]
    .venv/bin/python bench/interpreter.py --compare REF [--rounds N]

`--compare REF` measures only (b), before and after in the same run: the proctor package of
git revision REF (exported to a temporary directory) against this checkout's, in alternating
rounds, each a fresh process running 10,000 governed calls next to a bare pipe measured just
before them. It prints both p50s per round and the median of the after/before ratios.

Measures (a) a 100,000-iteration arithmetic loop, (b) 10,000 calls of an allowed
read-only tool (governed round trip p50 in 5 rounds, each next to a bare pipe round
trip measured just before it; the ratio is the median of the rounds'), (c) worker
start time (bubblewrap and process-only), (d) timeout overshoot. Targets: (a) >= 50x
faster than smolagents; (b) p50 <= 60 us and <= 4x the bare pipe; (c) <= 150 ms with
bubblewrap; (d) <= 100 ms.

smolagents is never a proctor dependency. Install it in a separate environment:

    python3 -m venv /tmp/benchvenv && /tmp/benchvenv/bin/pip install smolagents

and point the bench at it with SMOLAGENTS_PYTHON=/tmp/benchvenv/bin/python (that path is
also tried by default). Without it the smolagents column says "not installed".
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import structlog

from proctor.gate import Gate
from proctor.interpreter import Interpreter
from proctor.interpreter.sandbox import bwrap_status
from proctor.policy import Policy
from proctor.tools import tool

LOOP = "s = 0\nfor i in range(100000):\n    s += i * i % 7\ns"
CALLS = ("import time\nts = []\nfor i in range(10000):\n    t = time.perf_counter_ns()\n    lookup('a')\n"
         "    ts.append(time.perf_counter_ns() - t)\nts.sort()\nts[len(ts) // 2] / 1000")
SLEEPY = "import time\ntime.sleep(5)"
SPIN = "while True:\n    pass"
ROUNDS = 5


@tool(side_effect="read")
def lookup(order: str) -> str:
    """Look an order up.

    Args:
        order: Order id.
    """
    return order


def _gate() -> Gate:
    policy = Policy.from_dict({"version": 1, "default": "deny", "rules": [
        {"name": "reads", "match": {"side_effect": ["none", "read"]}, "decision": "allow"}]})
    return Gate(policy, tools=[lookup])


def bare_pipe_p50(n: int = 10000, *, spin: bool = True) -> float:
    """Round trip of one small length-prefixed frame to an echoing Python process, in microseconds.

    With `spin`, both ends poll for up to 200 µs before blocking, as proctor's channel
    does (with a registered poll object, as it does); without, they block at once and the
    figure swings (11-45 µs seen here) with how slowly an idle vCPU wakes up. The
    like-for-like baseline is the spinning one.
    """
    a, b = socket.socketpair()
    wait = ("    t=time.perf_counter_ns()+200000\n"
            "    while not p.poll(0) and time.perf_counter_ns()<t: pass\n") if spin else ""
    echo = ("import os,sys,select,time\nfd=int(sys.argv[1])\np=select.poll()\np.register(fd,select.POLLIN)\n"
            "while True:\n" + wait + "    d=os.read(fd,65536)\n    if not d: break\n    os.write(fd,d)\n")
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", echo, str(b.fileno())], pass_fds=[b.fileno()])
    b.close()
    body = json.dumps({"t": "call", "id": 1, "run": 1, "tool": "lookup", "args": {"order": "a"}}).encode()
    frame = len(body).to_bytes(4, "big") + body
    times = []
    poll = select.poll()
    poll.register(a.fileno(), select.POLLIN)
    for _ in range(n):
        t = time.perf_counter_ns()
        a.sendall(frame)
        if spin:
            until = time.perf_counter_ns() + 200_000
            while not poll.poll(0) and time.perf_counter_ns() < until:
                pass
        a.recv(65536)
        times.append(time.perf_counter_ns() - t)
    a.close()
    proc.wait()
    return statistics.median(times) / 1000


def gate_submit_p50(n: int = 10000) -> float:
    """gate.submit of the same call, in process, no channel: the gate's own share."""
    gate = _gate()
    ctx = gate.start_run()
    times = []
    for _ in range(n):
        t = time.perf_counter_ns()
        gate.submit("lookup", {"order": "a"}, context=ctx)
        times.append(time.perf_counter_ns() - t)
    return statistics.median(times) / 1000


def proctor_figures(sandbox: str) -> dict[str, float]:
    gate = _gate()
    starts = []
    for _ in range(7):
        t = time.perf_counter()
        py = Interpreter([lookup], gate, sandbox=sandbox, timeout=60)  # type: ignore[arg-type]
        starts.append((time.perf_counter() - t) * 1000)
        py.close()
    out: dict[str, float] = {"start_ms": statistics.median(starts[1:])}
    with Interpreter([lookup], gate, sandbox=sandbox, timeout=60) as py:  # type: ignore[arg-type]
        loops = []
        for _ in range(10):
            t = time.perf_counter()
            r = py.run(LOOP)
            loops.append(time.perf_counter() - t)
            assert r.error is None, r.error
        out["loop_ms"] = min(loops) * 1000
        # (b) in rounds, each next to a bare pipe measured just before it: the VM's speed drifts
        # over seconds, and the ratio should compare like with like.
        calls, bares, ratios = [], [], []
        for _ in range(ROUNDS):
            bare = bare_pipe_p50(4000)
            r = py.run(CALLS)
            assert r.error is None, r.error
            calls.append(float(r.value))
            bares.append(bare)
            ratios.append(float(r.value) / bare)
        out["call_p50_us"] = statistics.median(calls)
        out["bare_p50_us"] = statistics.median(bares)
        out["ratio"] = statistics.median(ratios)
        out["ratio_max"] = max(ratios)
        # The same loop with the gate's work replaced by a canned outcome: the channel's own share.
        canned = gate.submit("lookup", {"order": "a"})
        real_submit = gate.submit
        gate.submit = lambda *a, **k: canned  # type: ignore[method-assign]
        try:
            r = py.run(CALLS)
        finally:
            gate.submit = real_submit  # type: ignore[method-assign]
        out["channel_p50_us"] = float(r.value)
        overshoots = []
        py.timeout = 0.2
        for code in (SLEEPY, SPIN) * 4:
            time.sleep(0.3)  # as between agent steps: the replacement worker is up by the next run
            t = time.perf_counter()
            r = py.run(code)
            overshoots.append((time.perf_counter() - t - 0.2) * 1000)
            assert r.state_lost
        out["overshoot_ms"] = statistics.median(overshoots)
        out["overshoot_max_ms"] = max(overshoots)
    return out


SMOL = r"""
import json, statistics, time, threading
from smolagents.local_python_executor import LocalPythonExecutor
from smolagents import tool
@tool
def lookup(order: str) -> str:
    '''Look an order up.

    Args:
        order: Order id.
    '''
    return order
out = {}
starts = []
for _ in range(7):
    t = time.perf_counter(); ex = LocalPythonExecutor([]); ex.send_tools({"lookup": lookup})
    starts.append((time.perf_counter() - t) * 1000)
out["start_ms"] = statistics.median(starts[1:])
ex = LocalPythonExecutor(["time"]); ex.send_tools({"lookup": lookup})
loops = []
for _ in range(3):
    t = time.perf_counter(); ex(LOOP); loops.append(time.perf_counter() - t)
out["loop_ms"] = min(loops) * 1000
ex(CALLS_SETUP)
out["call_p50_us"] = float(ex(CALLS).output)
try:
    ex2 = LocalPythonExecutor(["time"], timeout_seconds=0.2); ex2.send_tools({})
except TypeError:
    ex2 = None
if ex2 is not None:
    t = time.perf_counter()
    try:
        ex2("import time\ntime.sleep(1.2)\ny = 7")
    except Exception:
        pass
    out["overshoot_ms"] = (time.perf_counter() - t - 0.2) * 1000
    out["timeout_y_set"] = ex2.state.get("y") == 7
print(json.dumps(out))
"""


def smolagents_figures() -> dict[str, Any] | str:
    python = os.environ.get("SMOLAGENTS_PYTHON", "/tmp/benchvenv/bin/python")
    if not os.path.exists(python):
        return "not installed (see the module docstring)"
    calls_setup = "import time\nts = []"
    calls = ("for i in range(10000):\n    t = time.perf_counter_ns()\n    lookup('a')\n"
             "    ts.append(time.perf_counter_ns() - t)\nts.sort()\nts[len(ts) // 2] / 1000")
    code = f"LOOP = {LOOP!r}\nCALLS_SETUP = {calls_setup!r}\nCALLS = {calls!r}\n" + SMOL
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:  # @tool reads its source
        fh.write(code)
    try:
        done = subprocess.run([python, fh.name], capture_output=True, text=True, timeout=600)
    finally:
        os.unlink(fh.name)
    if done.returncode != 0:
        return "failed: " + (done.stderr.strip().splitlines() or ["?"])[-1]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def one_round_b() -> dict[str, float]:
    """One (b) round in this process: governed p50 and the bare pipe's just before (for --compare)."""
    sandbox = "bwrap" if bwrap_status()[0] else "process"
    gate = _gate()
    with Interpreter([lookup], gate, sandbox=sandbox, timeout=600) as py:  # type: ignore[arg-type]
        py.run("for i in range(1000):\n    lookup('a')")  # warm-up: first-call costs, caches
        bare = bare_pipe_p50(4000)
        r = py.run(CALLS)
        assert r.error is None, r.error
    return {"call_p50_us": float(r.value), "bare_p50_us": bare}


def compare(ref: str, rounds: int) -> int:
    """(b) before (revision `ref`) and after (this checkout), alternating, in one run."""
    import shutil

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base = tempfile.mkdtemp(prefix="proctor-baseline-")
    try:
        archive = subprocess.run(["git", "-C", repo, "archive", ref, "proctor"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", base], input=archive.stdout, check=True)
        me = os.path.abspath(__file__)
        rows = []
        for i in range(rounds):
            pair = {}
            order = (("before", base), ("after", None)) if i % 2 == 0 else (("after", None), ("before", base))
            for label, path in order:
                env = dict(os.environ)
                if path is not None:
                    env["PYTHONPATH"] = path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
                done = subprocess.run([sys.executable, me, "--round-b"], capture_output=True, text=True, env=env,
                                      timeout=600, cwd=path or repo)
                if done.returncode != 0:
                    print(done.stderr[-2000:], file=sys.stderr)
                    return 1
                pair[label] = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(pair)
            b, a = pair["before"], pair["after"]
            print(f"round {i + 1}: before {b['call_p50_us']:.1f} µs (bare {b['bare_p50_us']:.1f}), "
                  f"after {a['call_p50_us']:.1f} µs (bare {a['bare_p50_us']:.1f}), "
                  f"after/before {a['call_p50_us'] / b['call_p50_us']:.3f}", flush=True)
        ratios = [r["after"]["call_p50_us"] / r["before"]["call_p50_us"] for r in rows]
        # Each side relative to its own bare pipe, too: the VM's speed drifts between processes.
        norm = [(r["after"]["call_p50_us"] / r["after"]["bare_p50_us"])
                / (r["before"]["call_p50_us"] / r["before"]["bare_p50_us"]) for r in rows]
        print(f"\n(b) before ({ref}) median {statistics.median(r['before']['call_p50_us'] for r in rows):.1f} µs, "
              f"after median {statistics.median(r['after']['call_p50_us'] for r in rows):.1f} µs; "
              f"after/before median {statistics.median(ratios):.3f} (each against its bare pipe: "
              f"{statistics.median(norm):.3f}); target <= 1.10")
        print(f"machine: {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}, python {sys.version.split()[0]}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


def main() -> int:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    if "--round-b" in sys.argv:
        print(json.dumps(one_round_b()))
        return 0
    if "--compare" in sys.argv:
        ref = sys.argv[sys.argv.index("--compare") + 1]
        rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 6
        return compare(ref, rounds)
    bwrap_ok = bwrap_status()[0]
    bare_blocking = bare_pipe_p50(spin=False)
    gate_us = gate_submit_p50()
    bw = proctor_figures("bwrap") if bwrap_ok else None
    proc = proctor_figures("process")
    smol = smolagents_figures()
    main_fig = bw or proc

    def cell(d: dict[str, Any] | str | None, key: str, fmt: str = "{:.1f}") -> str:
        if isinstance(d, str) or d is None or key not in d:
            return "—"
        return fmt.format(d[key])

    smol_d = smol if isinstance(smol, dict) else None
    rows = [
        ("(a) 100k-iteration loop, ms", cell(bw, "loop_ms"), cell(proc, "loop_ms"), cell(smol_d, "loop_ms"),
         f"{smol_d['loop_ms'] / main_fig['loop_ms']:.0f}x faster (target >= 50x)" if smol_d else "—"),
        ("(b) tool call round trip p50, µs", cell(bw, "call_p50_us"), cell(proc, "call_p50_us"),
         cell(smol_d, "call_p50_us", "{:.2f} (ungoverned, in-process)"),
         f"bare pipe {main_fig['bare_p50_us']:.1f} µs (blocking: {bare_blocking:.1f}); ratio "
         f"{main_fig['ratio']:.1f}x, worst round {main_fig['ratio_max']:.1f}x (targets <= 60 µs, <= 4x)"),
        ("(b) same, gate work stubbed out (channel only), µs", cell(bw, "channel_p50_us"),
         cell(proc, "channel_p50_us"), "—", f"gate.submit alone p50 {gate_us:.1f} µs"),
        ("(c) worker start, ms", cell(bw, "start_ms"), cell(proc, "start_ms"), cell(smol_d, "start_ms"),
         "target <= 150 ms with bubblewrap"),
        ("(d) timeout overshoot, ms (median / max)",
         f"{cell(bw, 'overshoot_ms')} / {cell(bw, 'overshoot_max_ms')}",
         f"{cell(proc, 'overshoot_ms')} / {cell(proc, 'overshoot_max_ms')}",
         (f"{smol_d['overshoot_ms']:.0f} (y set: {smol_d.get('timeout_y_set')})"
          if smol_d and "overshoot_ms" in smol_d else "no preemptive timeout"),
         "target <= 100 ms"),
    ]
    header = ("measure", "proctor (bwrap)", "proctor (process)", "smolagents LocalPythonExecutor", "verdict")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    print("\n".join(lines))
    if isinstance(smol, str):
        print(f"\nsmolagents: {smol}")
    print(f"\nmachine: {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}, python {sys.version.split()[0]}, "
          f"bwrap {'yes' if bwrap_ok else 'no'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
