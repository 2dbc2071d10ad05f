"""The hand-off floor of this machine: round trips between two processes over a socketpair, as
an Interpreter's host and worker make them, with and without each pair pinned to one core.

No proctor code: each pair is a "host" that sends 100 bytes and blocks in recv, and a "worker"
that blocks in recv and answers, each burning `--host-us` / `--worker-us` of CPU per round trip
(thread CPU time, so the work is the same however the scheduler shares the cores). Pairs run in
parallel; `pinned` keeps pair i's two processes on core i mod cores, so every hand-off is a switch
on one core; `free` leaves them where the scheduler puts them (wake-ups may land on an idle vCPU).
Rounds are interleaved. Use it to tell what the machine costs from what the channel costs:
a round trip of the real Interpreter is bounded below by the `--host-us 0 --worker-us 0` row.

`--threads 8` models 8 Interpreters in threads of one process instead: 8 host threads (one GIL,
their work is Python bytecode holding it) each with its worker process, laid out `free`, `split`
(host threads on one core, workers on the others),
`pairs` (thread i and its worker on core i mod cores) or `one` (every thread and worker on the first
core), against one pair alone; and, as `reactor-split` / `reactor-one`, one host thread serving all
8 workers through an `epoll` (each ready worker's trip in turn) instead of a thread each. Each row
prints the host process's and the workers' CPU per round trip: what the hand-offs cost beyond
`--host-us` + `--worker-us` in each layout.

`--fixed` makes each end's work a fixed amount of Python (small dicts encoded and decoded as JSON, the
count that takes `--host-us` / `--worker-us` on this machine alone, measured at start) instead of
a fixed amount of CPU time: a layout that makes the same work dearer (caches gone cold after a
switch, a GIL hand-off) then shows in the CPU a trip, as it does for a real Interpreter.

Run: .venv/bin/python bench/handoff.py [--trips 4000] [--rounds 3] [--host-us 50] [--worker-us 30] [--threads N]
     [--fixed]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import select
import socket
import statistics
import threading
import time
from typing import Any

#: With --fixed: rounds of `_work` standing for each amount of µs (measured before any pair starts;
#: forked processes inherit it).
_FIXED: dict[int, int] = {}


def _burn(us: int) -> None:
    if us in _FIXED:
        _work(_FIXED[us])
        return
    end = time.thread_time_ns() + us * 1000
    while time.thread_time_ns() < end:
        pass


def _work(rounds: int) -> int:
    """A fixed amount of Python of the kind a call's life runs: small dicts built, encoded, decoded."""
    out = []
    for i in range(rounds):
        out.append(json.dumps({"t": "call", "id": i, "tool": "lookup", "args": {"order": "A-1"}}))
    return len(json.loads("[" + ",".join(out) + "]"))


def _calibrate(us: int) -> int:
    """Rounds of `_work` that take `us` µs of CPU here, alone (the best of several tries)."""
    if us <= 0:
        return 0
    best = float("inf")
    for _ in range(20):
        began = time.thread_time_ns()
        _work(100)
        best = min(best, (time.thread_time_ns() - began) / 100)
    return max(1, round(us * 1000 / best))


def _pair(trips: int, host_us: int, worker_us: int, core: int | None, start: Any, out: Any) -> None:
    host, worker = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the worker
        host.close()
        _echo(worker, worker_us, core)
    worker.close()
    if core is not None:
        os.sched_setaffinity(0, {core})
    message = b"x" * 100
    start.wait()
    began = time.perf_counter()
    for _ in range(trips):
        host.send(message)
        host.recv(65536)
        _burn(host_us)
    out.put(trips / (time.perf_counter() - began))
    host.close()
    os.waitpid(pid, 0)


def run(pairs: int, trips: int, host_us: int, worker_us: int, pinned: bool) -> float:
    """Round trips per second of `pairs` pairs together."""
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    cores = sorted(os.sched_getaffinity(0))
    procs = [ctx.Process(target=_pair, args=(trips, host_us, worker_us, cores[i % len(cores)] if pinned else None,
                                              start, out)) for i in range(pairs)]
    for p in procs:
        p.start()
    time.sleep(0.3)
    start.set()
    total = sum(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    return float(total)


def _echo(sock: socket.socket, worker_us: int, core: int | None) -> None:
    if core is not None:
        os.sched_setaffinity(0, {core})
    while True:
        message = sock.recv(65536)
        if not message:
            os._exit(0)
        _burn(worker_us)
        sock.send(message)


def _cpu(pids: list[int]) -> tuple[float, float]:
    """CPU seconds of this process, and of the processes `pids` (`/proc/<pid>/schedstat`, ns: `stat`
    counts whole 10 ms ticks)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    workers = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/schedstat") as fh:
            workers += int(fh.read().split()[0]) / 1e9
    return usage.ru_utime + usage.ru_stime, workers


def in_threads(count: int, trips: int, host_us: int, worker_us: int,
               layout: str) -> tuple[float, float, float]:
    """Round trips per second of `count` host threads of this process (or one serving all, `reactor-*`),
    each with its own worker process; and the host's and the workers' CPU µs per round trip."""
    cores = sorted(os.sched_getaffinity(0))
    socks, pids = [], []
    for i in range(count):
        host, worker = socket.socketpair()
        core = {"split": cores[-1], "pairs": cores[i % len(cores)], "one": cores[0], "reactor-split": cores[-1],
                "reactor-one": cores[0]}.get(layout)
        pid = os.fork()
        if pid == 0:
            host.close()
            _echo(worker, worker_us, core)
        worker.close()
        socks.append(host)
        pids.append(pid)

    def serve(host: socket.socket, i: int) -> None:
        core = {"split": cores[0], "pairs": cores[i % len(cores)], "one": cores[0]}.get(layout)
        if core is not None:
            os.sched_setaffinity(0, {core})
        message = b"x" * 100
        for _ in range(trips):
            host.send(message)
            host.recv(65536)
            _burn(host_us)

    def reactor() -> None:
        os.sched_setaffinity(0, {cores[0]})
        poller = select.epoll()
        left = {}
        for s in socks:
            poller.register(s.fileno(), select.EPOLLIN)
            left[s.fileno()] = trips
            s.send(b"x" * 100)
        by_fd = {s.fileno(): s for s in socks}
        live = len(socks)
        while live:
            for fd, _ in poller.poll(10.0):
                host = by_fd[fd]
                host.recv(65536)
                _burn(host_us)
                left[fd] -= 1
                if left[fd]:
                    host.send(b"x" * 100)
                else:
                    live -= 1
        poller.close()

    if layout.startswith("reactor"):
        threads = [threading.Thread(target=reactor)]
    else:
        threads = [threading.Thread(target=serve, args=(s, i)) for i, s in enumerate(socks)]
    before = _cpu(pids)
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = count * trips / (time.perf_counter() - began)
    after = _cpu(pids)
    for s in socks:
        s.close()
    for pid in pids:
        os.waitpid(pid, 0)
    n = count * trips / 1e6
    return rate, (after[0] - before[0]) / n, (after[1] - before[1]) / n


_LAYOUTS = ("free", "split", "pairs", "one", "reactor-split", "reactor-one")


def threads_main(opts: argparse.Namespace) -> None:
    rows: dict[str, list[tuple[float, float, float]]] = {}
    for _ in range(opts.rounds):
        rows.setdefault("alone", []).append(in_threads(1, opts.trips, opts.host_us, opts.worker_us, "free"))
        for layout in _LAYOUTS:
            rows.setdefault(layout, []).append(
                in_threads(opts.threads, opts.trips // opts.threads, opts.host_us, opts.worker_us, layout))

    def median(layout: str) -> tuple[float, ...]:
        return tuple(statistics.median(row[k] for row in rows[layout]) for k in range(3))

    one, host, workers = median("alone")
    print(f"1 host thread, work {opts.host_us}+{opts.worker_us} µs: {one:8.0f} round trips/s | CPU a trip: host "
          f"{host:5.1f} µs, worker {workers:5.1f} µs")
    for layout in _LAYOUTS:
        rate, host, workers = median(layout)
        who = "1 thread serving all" if layout.startswith("reactor") else f"{opts.threads} host threads"
        print(f"{opts.threads} workers, {who:20}, {layout:13}: {rate:8.0f} round trips/s ({rate / one:.2f}x one) | "
              f"CPU a trip: host {host:5.1f} µs, workers {workers:5.1f} µs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trips", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--host-us", type=int, default=50)
    parser.add_argument("--worker-us", type=int, default=30)
    parser.add_argument("--threads", type=int, default=0, help="model N Interpreters in threads of one process")
    parser.add_argument("--fixed", action="store_true", help="fixed Python work per trip instead of fixed CPU time")
    opts = parser.parse_args()
    if opts.fixed:
        for us in (opts.host_us, opts.worker_us):
            _FIXED[us] = _calibrate(us)
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} usable cores; load average {os.getloadavg()[0]:.2f}; median of {opts.rounds} rounds; "
          f"round trips/s of all pairs together; work {'fixed Python' if opts.fixed else 'fixed CPU time'}")
    if opts.threads:
        threads_main(opts)
        print(f"load average {os.getloadavg()[0]:.2f}")
        return
    rows = [(p, w, pin) for w in ((0, 0), (opts.host_us, opts.worker_us)) for p in (1, 2) for pin in (False, True)]
    rates: dict[Any, list[float]] = {}
    for _ in range(opts.rounds):
        for pairs, (h, w), pin in rows:
            rates.setdefault((pairs, h, w, pin), []).append(run(pairs, opts.trips, h, w, pin))
    for (pairs, h, w, pin), got in rates.items():
        rate = statistics.median(got)
        one = statistics.median(rates[1, h, w, pin])
        print(f"{pairs} pair(s), work {h:3d}+{w:3d} µs, {'pinned' if pin else 'free  '}: {rate:8.0f} round trips/s "
              f"({1e6 * pairs / rate:6.1f} µs each; {rate / one:.2f}x one pair = {rate / one / pairs:.2f} x N)")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
