"""Many runs on one host, and the audit trail under them (issue #18, points 3 and 4).

Side by side, in one run:

- **threads**: calls/s of one `Interpreter` running a loop of allowed read calls, against 8
  Interpreters (8 workers) driven from 8 threads of this process. Target: 8 >= 1.0x one.
- **processes**: the same loop in 1, 2 and 4 host processes (one Interpreter each), aggregate
  calls/s against one process. Target: >= 0.8 x N up to the number of cores.
- **reference**: one host process and its worker held to one core (no spinning, no placing): what each of
  2 hosts can have on 2 cores. One host alone runs its thread and its worker on a core each, polling, with
  no sleep between them; 2 hosts cannot: each host and its worker take turns on one core, and a turn costs
  a switch. "2 hosts = x N of a one-core host" says how well the hosts scale once that is counted.
- both with the channel ends *placed* (`proctor.interpreter.spinning.PIN`, the default: a host
  thread and its worker kept on one core while the cores are scarce) and, beside it in the same
  rounds, not placed (`PIN = False`, as before).
- **group commit**: 8 Interpreters in threads making *write* calls (fsynced intents, file
  `AuditLog`), with group commit (and outcomes written, made durable by the next fsync) and as
  every release before it did: one fsync per durable record under the log's lock, outcomes fsynced
  too (`_Today`). Target: >= 3x. Group commit is measured both ways in the same rounds: with the
  native syncer (`proctor.audit._syncer`, the default where it is built) and pure Python
  (`AuditLog._native = False`). Also one Interpreter's read calls with the default (flushed) intents
  against `read_durability: fsync`.

Run: .venv/bin/python bench/concurrency.py [--calls 20000] [--dir DIR] [--sandbox process|bwrap] [--audit-only]
DIR should be on the disk the real audit log lives on (fsync cost is the disk's).

`--calls` defaults to 20000: on a fast machine (2026-12-01, 2 vCPUs, ~59k calls/s for one
Interpreter) a 2000-call run lasts ~33 ms, about as long as starting the host processes drifts
apart and one scheduler tick, and gave a spurious "2 hosts 0.99 x N" where 20000 calls gave 0.62.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from proctor import AuditLog, Gate, Interpreter, Policy, tool
from proctor.audit.log import NATIVE_GROUP_COMMIT
from proctor.interpreter import spinning


@tool(side_effect="read")
def lookup(order: str) -> str:
    """Look an order up.

    Args:
        order: Order id.
    """
    return "shipped"


@tool(side_effect="write")
def note(order: str) -> str:
    """Write a note on an order.

    Args:
        order: Order id.
    """
    return "noted"


def _policy(read_durability: str = "flush") -> Policy:
    return Policy.from_dict({"version": 1, "read_durability": read_durability, "rules": [
        {"name": "ok", "match": {"side_effect": ["read", "write"]}, "decision": "allow"}]})


def _program(name: str, calls: int) -> str:
    return f"for i in range({calls}):\n    {name}('A-1')\n"


class Costs:
    """What the calls of one measurement cost, per call: CPU (user + system) and context switches
    (voluntary + involuntary) of the host process (all its threads) and of the workers, from
    getrusage and /proc/<pid>/stat|status. Decides what wall clock cannot on a loaded machine: a
    figure that moves with the load while these stay put is the machine's, not the channel's."""

    def __init__(self) -> None:
        self.calls = 0
        self.host_cpu = self.host_switches = self.worker_cpu = self.worker_switches = 0.0

    def add(self, other: Costs) -> None:
        self.calls += other.calls
        self.host_cpu += other.host_cpu
        self.host_switches += other.host_switches
        self.worker_cpu += other.worker_cpu
        self.worker_switches += other.worker_switches

    def row(self) -> str:
        n = max(self.calls, 1)
        return (f"per call: host {self.host_cpu / n * 1e6:5.0f} µs CPU, {self.host_switches / n:4.2f} switches | "
                f"worker {self.worker_cpu / n * 1e6:5.0f} µs CPU, {self.worker_switches / n:4.2f} switches")


def _sample(pids: list[int]) -> tuple[float, float, float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    tick = os.sysconf("SC_CLK_TCK")
    cpu = switches = 0.0
    todo = list(pids)
    while todo:  # under bubblewrap the worker is a child of the process the host started
        pid = todo.pop()
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
            todo += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except (OSError, ValueError):
            continue
        cpu += (int(stat[11]) + int(stat[12])) / tick
        switches += int(status["voluntary_ctxt_switches"]) + int(status["nonvoluntary_ctxt_switches"])
    return usage.ru_utime + usage.ru_stime, usage.ru_nvcsw + usage.ru_nivcsw, cpu, switches


def _measured(pys: list[Interpreter], calls: int, run: Any) -> tuple[Any, Costs]:
    pids = [py._worker.proc.pid for py in pys if py._worker is not None]
    before = _sample(pids)
    out = run()
    after = _sample(pids)
    costs = Costs()
    costs.calls = calls
    costs.host_cpu, costs.host_switches, costs.worker_cpu, costs.worker_switches = (
        b - a for a, b in zip(before, after, strict=True))
    return out, costs


def _drive(interpreters: list[Interpreter], name: str, calls: int) -> float:
    """Run one loop of `calls` calls in each interpreter, each from its own thread; return calls/s."""
    barrier = threading.Barrier(len(interpreters) + 1)
    errors: list[Any] = []

    def work(py: Interpreter) -> None:
        barrier.wait()
        r = py.run(_program(name, calls))
        if r.error is not None:
            errors.append(r.error)

    threads = [threading.Thread(target=work, args=(py,)) for py in interpreters]
    for t in threads:
        t.start()
    barrier.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise RuntimeError(errors[0])
    return len(interpreters) * calls / elapsed


def in_threads(count: int, calls: int, sandbox: str, audit: Any = None, name: str = "lookup",
               policy: Policy | None = None, pin: bool = True, costs: Costs | None = None) -> float:
    spinning.PIN = pin
    gate = Gate(policy or _policy(), audit=audit, tools=[lookup, note])
    pys = [Interpreter([lookup, note], gate, sandbox=sandbox, timeout=600) for _ in range(count)]  # type: ignore[arg-type]
    try:
        for py in pys:
            py.run("pass")  # the worker is up
        rate, spent = _measured(pys, count * calls, lambda: _drive(pys, name, calls))
        if costs is not None:
            costs.add(spent)
        return float(rate)
    finally:
        for py in pys:
            py.close()


def _process_main(calls: int, sandbox: str, start: Any, out: Any, pin: bool, core: int | None = None) -> None:
    spinning.PIN = pin
    if core is not None:  # this host and its worker (which inherits it) on one core: no spinning, no placing
        os.sched_setaffinity(0, {core})
    gate = Gate(_policy(), tools=[lookup])
    with Interpreter([lookup], gate, sandbox=sandbox, timeout=600) as py:  # type: ignore[arg-type]
        py.run("pass")
        start.wait()
        began = time.perf_counter()
        _, costs = _measured([py], calls, lambda: py.run(_program("lookup", calls)))
        out.put((calls / (time.perf_counter() - began), costs))


def in_processes(count: int, calls: int, sandbox: str, pin: bool = True, costs: Costs | None = None,
                 core: int | None = None) -> float:
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_process_main, args=(calls, sandbox, start, out, pin, core)) for _ in range(count)]
    for p in procs:
        p.start()
    time.sleep(3.0)  # every host process is up with its worker
    start.set()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    for _, spent in results:
        if costs is not None:
            costs.add(spent)
    return float(sum(rate for rate, _ in results))


class _PurePython(AuditLog):
    """Group commit without the native syncer: the appending threads take turns to fsync."""

    _native = False


class _Today(AuditLog):
    """The log as every release before group commit used it: one fsync per durable record under the lock,
    and the gate asking for durable outcomes too (9735f1a: two fsyncs a write call)."""

    _group_commit = False

    def append(self, kind: str, fields: Any, *, durable: bool = True) -> Any:
        return super().append(kind, fields, durable=durable or kind == "call_outcome")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--sandbox", default="process")
    parser.add_argument("--audit-only", action="store_true", help="only the group commit and read durability rows")
    opts = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} usable cores; load average {os.getloadavg()[0]:.2f}; sandbox {opts.sandbox}; "
          f"median of {opts.rounds} rounds")

    one: list[float] = []
    eight: list[float] = []
    loose: list[float] = []
    costs = {"one": Costs(), "eight": Costs(), "loose": Costs()}
    for _ in range(0 if opts.audit_only else opts.rounds):
        one.append(in_threads(1, opts.calls, opts.sandbox, costs=costs["one"]))
        eight.append(in_threads(8, opts.calls // 4, opts.sandbox, costs=costs["eight"]))
        loose.append(in_threads(8, opts.calls // 4, opts.sandbox, pin=False, costs=costs["loose"]))
    if not opts.audit_only:
        o, e, u = statistics.median(one), statistics.median(eight), statistics.median(loose)
        print(f"\nthreads   1 Interpreter {o:8.0f} calls/s | 8 Interpreters in threads {e:8.0f} calls/s "
              f"| ratio {e / o:.2f}x (target >= 1.0x)")
        print(f"          not placed (PIN = False):        8 in threads {u:8.0f} calls/s | ratio {u / o:.2f}x")
        for label, key in (("1 Interpreter", "one"), ("8 in threads", "eight"), ("8 not placed", "loose")):
            print(f"          {label:14} {costs[key].row()}")
        scaling(opts, cores)
    audit_rows(opts)
    print(f"\nload average {os.getloadavg()[0]:.2f}")


def scaling(opts: argparse.Namespace, cores: int) -> None:
    rates: dict[tuple[int, bool], list[float]] = {}
    costs: dict[tuple[int, bool], Costs] = {}
    alone: list[float] = []  # one host and its worker kept on one core: what each of `cores` hosts can have
    for _ in range(opts.rounds):  # interleaved: each round measures every row once
        for n, pin in ((1, True), (2, True), (2, False), (4, True), (4, False)):
            spent = costs.setdefault((n, pin), Costs())
            rates.setdefault((n, pin), []).append(in_processes(n, opts.calls, opts.sandbox, pin, spent))
        alone.append(in_processes(1, opts.calls, opts.sandbox, core=min(os.sched_getaffinity(0))))
    base = statistics.median(rates[1, True])
    per_core = statistics.median(alone)
    for n in (2, 4):
        target = "target >= 0.8 x N" if n <= cores else f"beyond the {cores} cores: for reference"
        for pin in (True, False):
            agg = statistics.median(rates[n, pin])
            how = "" if pin else " not placed"
            print(f"processes {n} hosts{how} {agg:8.0f} calls/s vs 1 host {base:8.0f} | {agg / base:.2f}x = "
                  f"{agg / base / n:.2f} x N ({target})")
    for n, pin in ((1, True), (2, True), (2, False), (4, True), (4, False)):
        print(f"          {n} host{'s' if n > 1 else ' '}{'' if pin else ' not placed'}  {costs[n, pin].row()}")
    # Why 0.8 x N is out of reach on a machine of 2 cores: one host alone polls on both (its thread and its worker
    # each on a core, no sleep between them); N = cores hosts share them, a host and its worker taking turns on
    # one core. Against one host held to one core, the hosts scale as below.
    two = statistics.median(rates[2, True])
    print(f"          reference: 1 host held to one core {per_core:8.0f} calls/s ({per_core / base:.2f}x one host "
          f"free) | 2 hosts = {two / per_core:.2f} x that = {two / per_core / 2:.2f} x N of a one-core host")


def audit_rows(opts: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir=opts.dir) as tmp:
        def audited(kind: type[AuditLog], count: int, name: str, read_durability: str = "flush",
                    durability: str = "fsync") -> float:
            path = Path(tmp) / f"audit-{time.monotonic_ns()}.jsonl"
            log = kind(path, durability=durability)
            try:
                return in_threads(count, opts.calls // 8, opts.sandbox, audit=log, name=name,
                                  policy=_policy(read_durability))
            finally:
                log.close()

        grouped, pure, serial, flushed_only, unaudited = [], [], [], [], []
        for _ in range(opts.rounds):
            grouped.append(audited(AuditLog, 8, "note"))
            serial.append(audited(_Today, 8, "note"))
            pure.append(audited(_PurePython, 8, "note"))
            # The ceilings: the same log never fsyncing, and no audit sink at all.
            flushed_only.append(audited(AuditLog, 8, "note", durability="flush"))
            unaudited.append(in_threads(8, opts.calls // 8, opts.sandbox, name="note"))
        g, s, p = statistics.median(grouped), statistics.median(serial), statistics.median(pure)
        f, n = statistics.median(flushed_only), statistics.median(unaudited)
        how = "native syncer" if NATIVE_GROUP_COMMIT else "pure Python: proctor.audit._syncer is not built"
        print(f"\nwrites, 8 Interpreters, file AuditLog: group commit ({how}) {g:7.0f} calls/s | one fsync per "
              f"record {s:7.0f} calls/s | {g / s:.2f}x (target >= 3x)")
        print(f"  group commit in pure Python (AuditLog._native = False) {p:7.0f} calls/s ({p / s:.2f}x)")
        print(f"  ceilings: the log never fsyncing (durability=flush) {f:7.0f} calls/s ({f / s:.2f}x), "
              f"no audit sink {n:7.0f} calls/s ({n / s:.2f}x)")
        flushed = statistics.median(audited(AuditLog, 1, "lookup") for _ in range(opts.rounds))
        synced = statistics.median(audited(AuditLog, 1, "lookup", "fsync") for _ in range(opts.rounds))
        print(f"reads, 1 Interpreter, file AuditLog: flushed intents (default) {flushed:7.0f} calls/s | "
              f"read_durability: fsync {synced:7.0f} calls/s | {flushed / synced:.2f}x")


if __name__ == "__main__":
    main()
