"""Whether the two ends of a channel may poll before they block (spin), or must block at once.

Polling for up to `SPIN_NS` before a blocking read makes one interpreter's round trip faster on a
VM (a vCPU that goes idle in a blocking read wakes up slowly; see docs/benchmarks.md, "Interpreter
round trip"). But a spinning end occupies a core: it pays only while each end of the channel has a
core of its own, and otherwise it takes the core (and, in one host process, the GIL) from an end
that has work. So an end polls only when its run is alone:

- in this process, only while a single `Interpreter.run` is in progress (`enter`/`leave`): a
  second host thread spinning would hold the GIL the first needs;
- on this machine, only while its runnable threads (the 4th field of `/proc/loadavg`, read at most
  once per `CHECK_NS`) have not outnumbered the cores this process may use at any look for the
  last `QUIET_NS`: when other runs (of other host processes, or any other work) are waiting for a
  core, nobody spins. A spinning end is itself runnable, so two lone runs of two processes on two
  cores see each other and both block. One look is not enough: another run whose two ends are both
  between hand-offs at that instant is not runnable, and is missed; over `QUIET_NS` of looks (one a
  millisecond while the run waits) a run that exists is seen;
- never on a single core, where the other end can only run once this one stops.

The worker follows its host: each reply (and each run message) says whether the worker may spin
while it waits for the next one. The reply to a call that took longer than the worker's spin window
says no whatever the machine (`Interpreter._on_result`): the program's next call is most often to
the same tool, and polling for an answer that takes a millisecond (an MCP server's) only burns CPU.
None of this is a security boundary: a worker that spins anyway only burns its own CPU limit.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["CHECK_NS", "DISABLED", "QUIET_NS", "SPIN_NS", "enter", "leave", "may_spin", "runs"]

#: How long a reader polls before it blocks, when it may spin.
SPIN_NS = 200_000
#: How often the machine's runnable threads are read again.
CHECK_NS = 1_000_000
#: How long the machine must have been seen with no more runnable threads than cores before an end spins.
QUIET_NS = 50_000_000
#: Set to True to never spin (tests, and instruction counts that must not include polling).
DISABLED = False

_lock = threading.Lock()
#: `Interpreter.run`s in progress in this process.
runs = 0
_cpus = 0
_verdict = True  # the last decision about the machine, reused for CHECK_NS
_checked = -(1 << 62)
_quiet_from = -(1 << 62)  # monotonic ns from which, unless a look sees the machine busy again, it is quiet
_loadavg = -1  # fd of /proc/loadavg; -1 not opened yet, -2 unavailable


def enter() -> None:
    """An `Interpreter.run` starts in this process."""
    global runs
    with _lock:
        runs += 1


def leave() -> None:
    """An `Interpreter.run` ended."""
    global runs
    with _lock:
        runs -= 1


def may_spin() -> bool:
    """Whether a channel end of this process may poll before it blocks, now."""
    global _verdict, _checked, _quiet_from
    if DISABLED or runs > 1:
        return False
    now = time.monotonic_ns()
    if now - _checked >= CHECK_NS:
        _checked = now
        cpus = _usable()
        running = _running()
        if cpus < 2 or (running is not None and running > cpus):
            _quiet_from = now + QUIET_NS
            _verdict = False
        else:
            _verdict = now >= _quiet_from
    return _verdict


def _usable() -> int:
    global _cpus
    if not _cpus:
        try:
            _cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            _cpus = 0
        _cpus = _cpus or os.cpu_count() or 1
    return _cpus


def _running() -> int | None:
    """Threads runnable on this machine right now, this one included (None where unknown)."""
    global _loadavg
    if _loadavg == -1:
        try:
            _loadavg = os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            _loadavg = -2
    if _loadavg < 0:
        return None
    try:
        fields = os.pread(_loadavg, 128, 0).split()  # b"0.52 0.58 0.59 3/412 12345"
        return int(fields[3].partition(b"/")[0])
    except (OSError, IndexError, ValueError):
        return None
