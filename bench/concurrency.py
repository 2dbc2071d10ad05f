"""What a host serving many agents pays: CPU per governed call and throughput with many runs (issue #33.5).

Side by side, in one run:

- **CPU per call, 1, 2 and 8 runs**: one host process drives 1, 2 or 8 `Interpreter`s from as many
  threads (a loop of allowed read calls each, no audit sink). A call's CPU is everything the machine
  spent on it: user + system time of the host process (all its threads, `getrusage(RUSAGE_SELF)`)
  and of every worker process (`/proc/<pid>/stat`, bubblewrap's processes included), divided by the
  calls made. Target: 8 runs <= 1.3x one run's CPU per call (more runs must not make each call dearer).
- **N processes against N one-core processes**: N host processes (one Interpreter each) at once,
  aggregate calls/s, against the *reference*: one host process and its worker confined to one core
  (`os.sched_setaffinity` before the worker starts: it inherits it), times N. That is what N runs can
  have physically on N cores, whatever the machine. Target: >= 0.9 x N of the reference for every N up
  to the usable cores (beyond them the reference is the cores, `min(N, cores)`, shown for reference).
  N is 1, 2, 4 and 8 (`--processes`), and the usable cores when there are more than 8.
- **no spinning while others wait**: the CPU per call of those N processes against the reference's
  (which never polls: it has one core), for every N whose channel ends (a host thread and a worker
  each) outnumber the cores. A run that polled a core while another run waits for one would show
  here as CPU spent on no call. Target: <= 1.3x.
- **group commit**: 8 Interpreters in threads making *write* calls (fsynced intents, file
  `AuditLog`) with group commit, against one fsync per durable record under the log's lock with
  outcomes fsynced too (`_OneFsyncPerRecord`, as releases before group commit did). Target: >= 3x.
  DIR (`--dir`) should be on the disk the real audit log lives on: fsync cost is the disk's.

Run: .venv/bin/python bench/concurrency.py [--quick] [--calls 20000] [--rounds 3] [--processes 1,2,4,8]
     [--sandbox process|bwrap] [--dir DIR] [--no-audit]

`--quick` (one round, fewer calls; under 3 minutes on a 16-core machine and on a loaded 2-core one)
prints the same table. Every figure is a ratio of rows measured in the same rounds, interleaved, so
a machine's drift touches them alike; the table says the load average before and after. Medians of
`--rounds` rounds.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proctor import AuditLog, Gate, Interpreter, Policy, tool


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


def _policy() -> Policy:
    return Policy.from_dict({"version": 1, "rules": [
        {"name": "ok", "match": {"side_effect": ["read", "write"]}, "decision": "allow"}]})


def _program(name: str, calls: int) -> str:
    return f"for i in range({calls}):\n    {name}('A-1')\n"


@dataclass
class Costs:
    """Calls made, wall seconds they took, and the CPU seconds (user + system) host and workers spent."""

    calls: int = 0
    seconds: float = 0.0
    host_cpu: float = 0.0
    worker_cpu: float = 0.0
    switches: int = 0

    def add(self, other: Costs) -> None:
        self.calls += other.calls
        self.seconds = max(self.seconds, other.seconds)  # runs side by side: the slowest sets the time
        self.host_cpu += other.host_cpu
        self.worker_cpu += other.worker_cpu
        self.switches += other.switches

    @property
    def rate(self) -> float:
        """Aggregate calls per second."""
        return self.calls / self.seconds if self.seconds else 0.0

    @property
    def cpu_per_call(self) -> float:
        """µs of CPU (host + workers) per call."""
        return (self.host_cpu + self.worker_cpu) / max(self.calls, 1) * 1e6


@dataclass
class Series:
    """One row's measurements over the rounds."""

    rounds: list[Costs] = field(default_factory=list)

    def rate(self) -> float:
        return statistics.median(c.rate for c in self.rounds)

    def cpu(self) -> float:
        return statistics.median(c.cpu_per_call for c in self.rounds)

    def host(self) -> float:
        return statistics.median(c.host_cpu / max(c.calls, 1) * 1e6 for c in self.rounds)

    def workers(self) -> float:
        return statistics.median(c.worker_cpu / max(c.calls, 1) * 1e6 for c in self.rounds)

    def switches(self) -> float:
        return statistics.median(c.switches / max(c.calls, 1) for c in self.rounds)


def _workers() -> tuple[float, int]:
    """CPU seconds and context switches of this process's descendants now alive: its workers (under
    bubblewrap, bubblewrap's processes and the worker under them). CPU from `/proc/<pid>/schedstat`
    (nanoseconds: `/proc/<pid>/stat` counts whole clock ticks, 10 ms, as much as a short run's worker
    spends), `stat` where there is no schedstat."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu, switches = 0.0, 0
    me = os.getpid()
    todo: list[int] = []
    for task in os.listdir(f"/proc/{me}/task"):
        try:
            todo += [int(c) for c in Path(f"/proc/{me}/task/{task}/children").read_text().split()]
        except OSError:  # a thread that ended since it was listed
            continue
    seen: set[int] = set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            try:
                spent = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
            except (OSError, ValueError, IndexError):
                spent = (int(stat[11]) + int(stat[12])) / tick
            status = Path(f"/proc/{pid}/status").read_text()
            for task in os.listdir(f"/proc/{pid}/task"):
                todo += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except (OSError, ValueError):
            continue
        cpu += spent
        switches += sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches:" in line)
    return cpu, switches


def _host() -> tuple[float, int]:
    """CPU seconds and context switches of this process, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_nvcsw + usage.ru_nivcsw


def _measured(pys: list[Interpreter], calls: int, name: str) -> Costs:
    """Run one loop of `calls` calls in each interpreter, each from its own thread, and what it cost."""
    barrier = threading.Barrier(len(pys) + 1)
    errors: list[Any] = []

    def work(py: Interpreter) -> None:
        barrier.wait()
        r = py.run(_program(name, calls))
        if r.error is not None:
            errors.append(r.error)

    threads = [threading.Thread(target=work, args=(py,)) for py in pys]
    for t in threads:
        t.start()
    (host, host_sw), (workers, workers_sw) = _host(), _workers()
    barrier.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    (host_end, host_sw_end), (workers_end, workers_sw_end) = _host(), _workers()
    spent = Costs(len(pys) * calls, elapsed, host_end - host, workers_end - workers,
                  host_sw_end - host_sw + workers_sw_end - workers_sw)
    if errors:
        raise RuntimeError(errors[0])
    return spent


def in_threads(count: int, calls: int, sandbox: str, audit: Any = None, name: str = "lookup") -> Costs:
    gate = Gate(_policy(), audit=audit, tools=[lookup, note])
    pys = [Interpreter([lookup, note], gate, sandbox=sandbox, timeout=600) for _ in range(count)]  # type: ignore[arg-type]
    try:
        for py in pys:
            py.run(_program(name, 50))  # the worker is up, and the first calls' one-off costs are paid
        return _measured(pys, calls, name)
    finally:
        for py in pys:
            py.close()


def _process_main(calls: int, sandbox: str, ready: Any, start: Any, out: Any, core: int | None) -> None:
    if core is not None:  # this host and its worker (which inherits it) on one core
        os.sched_setaffinity(0, {core})
    gate = Gate(_policy(), tools=[lookup])
    with Interpreter([lookup], gate, sandbox=sandbox, timeout=600) as py:  # type: ignore[arg-type]
        py.run(_program("lookup", 50))
        ready.put(os.getpid())
        start.wait()
        out.put(_measured([py], calls, "lookup"))


def in_processes(count: int, calls: int, sandbox: str, core: int | None = None) -> Costs:
    """`count` host processes at once, each running `calls` calls; their costs summed."""
    ctx = multiprocessing.get_context("spawn")
    ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_process_main, args=(calls, sandbox, ready, start, out, core)) for _ in range(count)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=300)  # every host process is up with its worker
    start.set()
    total = Costs()
    for _ in procs:
        total.add(out.get(timeout=900))
    for p in procs:
        p.join()
    return total


class _OneFsyncPerRecord(AuditLog):
    """The log as releases before group commit used it: one fsync per durable record under the lock,
    and durable outcomes too (two fsyncs a write call)."""

    _group_commit = False

    def append(self, kind: str, fields: Any, *, durable: bool = True) -> Any:
        return super().append(kind, fields, durable=durable or kind == "call_outcome")


def _audited(kind: type[AuditLog], tmp: str, calls: int, sandbox: str) -> Costs:
    log = kind(Path(tmp) / f"audit-{time.monotonic_ns()}.jsonl")
    try:
        return in_threads(8, calls, sandbox, audit=log, name="note")
    finally:
        log.close()


DEFAULT_PROCESSES = "1,2,4,8"


def _verdict(value: float, target: float, at_least: bool) -> str:
    ok = value >= target if at_least else value <= target
    return "holds" if ok else "MISSED"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round, fewer calls: the same table in minutes")
    parser.add_argument("--calls", type=int, default=None, help="calls per run (default 20000; --quick 4000)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3; --quick 1)")
    parser.add_argument("--processes", default=DEFAULT_PROCESSES,
                        help="process counts to measure (default 1,2,4,8, and the usable cores when more)")
    parser.add_argument("--sandbox", default="process")
    parser.add_argument("--dir", default=None, help="where the group-commit audit logs go")
    parser.add_argument("--no-audit", action="store_true", help="skip the group commit row")
    opts = parser.parse_args()
    calls = opts.calls or (4000 if opts.quick else 20000)
    rounds = opts.rounds or (1 if opts.quick else 3)
    allowed = sorted(os.sched_getaffinity(0))
    cores = len(allowed)
    counts = sorted({int(n) for n in opts.processes.split(",")})
    if opts.processes == DEFAULT_PROCESSES and cores > max(counts):
        counts.append(cores)  # so that some row has more channel ends than cores: the spinning check
    load = os.getloadavg()[0]
    began = time.monotonic()

    threads = {n: Series() for n in (1, 2, 8)}
    procs = {n: Series() for n in counts}
    reference = Series()
    grouped, serial = Series(), Series()
    with tempfile.TemporaryDirectory(dir=opts.dir) as tmp:
        for _ in range(rounds):  # interleaved: each round measures every row once
            for n in threads:
                threads[n].rounds.append(in_threads(n, max(calls // n, 500), opts.sandbox))
            reference.rounds.append(in_processes(1, calls, opts.sandbox, core=allowed[-1]))
            for n in counts:
                procs[n].rounds.append(in_processes(n, calls, opts.sandbox))
            if not opts.no_audit:
                grouped.rounds.append(_audited(AuditLog, tmp, max(calls // 16, 250), opts.sandbox))
                serial.rounds.append(_audited(_OneFsyncPerRecord, tmp, max(calls // 16, 250), opts.sandbox))

    print(f"{cores} usable cores; load average {load:.2f} -> {os.getloadavg()[0]:.2f}; sandbox {opts.sandbox}; "
          f"{calls} calls a run; median of {rounds} round{'s' if rounds > 1 else ''}; "
          f"{time.monotonic() - began:.0f} s")
    rows: list[tuple[str, str, str, str]] = []
    one = threads[1]
    for n, series in threads.items():
        detail = (f"{series.cpu():6.1f} µs CPU a call (host {series.host():5.1f}, workers {series.workers():5.1f}; "
                  f"{series.switches():4.2f} switches), {series.rate():8.0f} calls/s")
        if n == 1:
            rows.append(("runs in threads: 1", detail, "", ""))
        else:
            ratio = series.cpu() / one.cpu()
            target = "<= 1.3x" if n == 8 else ""
            rows.append((f"runs in threads: {n}", f"{detail}; CPU {ratio:4.2f}x one run's", target,
                         _verdict(ratio, 1.3, at_least=False) if target else ""))
    ref_rate, ref_cpu = reference.rate(), reference.cpu()
    ref_detail = f"{ref_cpu:6.1f} µs CPU a call ({reference.switches():4.2f} switches), {ref_rate:8.0f} calls/s"
    rows.append(("1 process on one core (reference)", ref_detail, "", ""))
    for n, series in procs.items():
        physical = min(n, cores)
        share = series.rate() / (physical * ref_rate)
        cpu = series.cpu() / ref_cpu
        # Throughput is judged up to the cores; spinning where the runs' ends (a host thread and a worker
        # each) outnumber the cores, so that a run polling would hold a core another run waits for.
        targets, verdicts = [], []
        if n <= cores:
            targets.append(">= 0.9 x N")
            verdicts.append(_verdict(share, 0.9, at_least=True))
        if 2 * n > cores:
            targets.append("CPU <= 1.3x")
            verdicts.append(_verdict(cpu, 1.3, at_least=False))
        rows.append((f"{n} process{'es' if n > 1 else ''}",
                     f"{series.rate():8.0f} calls/s = {share:4.2f} x {physical} x reference; "
                     f"CPU a call {cpu:4.2f}x the reference's ({series.switches():4.2f} switches)", "; ".join(targets),
                     ", ".join(verdicts)))
    if not opts.no_audit:
        ratio = grouped.rate() / serial.rate()
        rows.append(("writes, 8 runs, file AuditLog",
                     f"group commit {grouped.rate():7.0f} calls/s, one fsync per record {serial.rate():7.0f}: "
                     f"{ratio:4.2f}x; CPU a call {grouped.cpu():5.0f} / {serial.cpu():5.0f} µs", ">= 3x",
                     _verdict(ratio, 3.0, at_least=True)))
    width = max(len(r[0]) for r in rows)
    detail_width = max(len(r[1]) for r in rows)
    for name, detail, target, verdict in rows:
        print(f"  {name:<{width}}  {detail:<{detail_width}}  {target:<24} {verdict}")


if __name__ == "__main__":
    main()
