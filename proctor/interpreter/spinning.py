"""Whether the two ends of a channel may poll before they block (spin), or must block at once.

Polling for up to `SPIN_NS` before a blocking read makes one interpreter's round trip several
times faster on a VM (a vCPU that goes idle in a blocking read wakes up slowly; see
docs/benchmarks.md). But a spinning end occupies a core: it pays only while each end of the
channel has a core of its own. With more interpreters active than the machine has cores for
(2 per interpreter: its host thread and its worker), spinners take the cores — and, in one
host process, the GIL — from the ends that have work, and throughput falls (8 Interpreters in
threads of one process reached 0.78x one Interpreter; 2 host processes 0.49 x N, both on a quiet
2-core machine, all spinning).

So a host spins only while the interpreters active on this machine fit its cores, and a core
is idle for each end:

- in this process, only while a single `Interpreter.run` is in progress (`enter`/`leave`):
  a second host thread spinning would hold the GIL the first needs;
- across processes, while the runs of every host process, each seen through a small shared
  page (`/dev/shm/proctor-hosts-<uid>`), take at most half the usable cores. Each host process
  holds one 64-byte slot of the page (a `lockf` range lock, released when the process ends) and
  writes there, about once a millisecond while it serves calls, the time and its number of
  active runs; a slot not written for `RECENT_NS` does not count (a process that crashed, or
  that is waiting for a human). Reading the page is one `pread`; it is re-read at most once
  per `CHECK_NS`;
- while the machine's runnable threads (the 4th field of `/proc/loadavg`, read at most once
  per `CHECK_NS`) do not outnumber its usable cores: on a machine busy with other work, a
  spinning end only takes turns from it (measured under a load of 8 on 2 cores: one
  Interpreter spinning used 426 µs of host CPU a call).

The worker follows its host: each reply (and each run message) says whether the worker may spin
while it waits for the next one.

When the ends may not spin because this machine's interpreters fill its cores (not because of
other work), they are *placed* (`placement`): a round trip is strictly one end after the other,
so a host process with one active run keeps its host thread and its worker on one core, and the
hand-offs between them are switches on that core, not wake-ups of another, idle, vCPU (on this
VM such a wake-up costs tens of µs, and the scheduler packed two interpreters' four ends onto
one vCPU: 2 host processes made 1.03x one). Each process picks the core fewest other host
processes are on (their slots on the page say which), so two hosts on two cores take one each.
A process with several runs (threads: one GIL) keeps its host threads on one core and their
workers on the others. A host thread's own affinity is restored when its run ends.
`PIN = False` turns placing off.

None of this is a security boundary: the page only decides who spins and where, and a worker
that spins anyway, or moves itself, only burns its own CPU limit.
"""

from __future__ import annotations

import os
import stat
import struct
import tempfile
import threading
import time

__all__ = [
    "CALM", "CHECK_NS", "PIN", "RECENT_NS", "SPIN_NS", "allowed", "enter", "leave", "may_spin", "pin_thread",
    "placement", "runs",
]

#: How long a reader polls before it blocks, when it may spin.
SPIN_NS = 200_000
#: A host process whose slot was written this recently counts as active.
RECENT_NS = 20_000_000
#: How often the shared page is read again (and this process's slot written).
CHECK_NS = 1_000_000
#: Set to True to never spin nor place (tests, and instruction counts that must not include polling).
DISABLED = False
#: Set to False to never pin a host thread and its worker to cores when they may not spin.
PIN = True
#: Decisions (one per CHECK_NS at most) that must find no other work on the machine before ends are placed.
CALM = 8
#: Where this process's channel ends should run now: None (wherever the scheduler puts them), or
#: (the core of its host threads, the cores of their workers). Replaced, never changed in place:
#: a host compares it by identity at each wait.
placement: tuple[int, frozenset[int]] | None = None

_SLOTS = 32
_SLOT = 64  # bytes per slot: one cache line, so hosts writing their slots do not share one
_PAGE = _SLOTS * _SLOT
_FIELDS = struct.Struct("<qqq")  # time written (monotonic ns), active runs, host core (-1: not placed)

_lock = threading.Lock()
#: `Interpreter.run`s in progress in this process.
runs = 0
_cpus = 0
_allowed: frozenset[int] = frozenset()  # the cores this process may use (its affinity when first asked)
_core = -1  # the core of this process's host threads while placed
_calm = 0  # decisions that found no other work, less those that found some (0..CALM)
_local = threading.local()  # per host thread: the affinity it had before it was pinned
_verdict = True  # the last decision, reused for CHECK_NS
_checked = -(1 << 62)
_board: _Board | None = None
_board_pid = 0  # the process that opened `_board` (a forked child opens its own)
_loadavg = -1  # fd of /proc/loadavg; -1 not opened yet, -2 unavailable


def enter() -> None:
    """An `Interpreter.run` starts in this process (other processes see it at once)."""
    _local.depth = getattr(_local, "depth", 0) + 1  # runs in progress in this thread (a tool may run another)
    _count(1)


def leave() -> None:
    """An `Interpreter.run` ended (in the thread that ran it: its own affinity comes back with its last run)."""
    _count(-1)
    _local.depth = depth = getattr(_local, "depth", 1) - 1
    if depth <= 0:
        pin_thread(None)


def pin_thread(core: int | None) -> None:
    """Keep the calling thread on `core` (None: give it back the affinity it had before)."""
    saved = getattr(_local, "saved", None)
    try:
        if core is None:
            if saved is not None:
                _local.saved = None
                os.sched_setaffinity(0, saved)
            return
        if saved is None:
            _local.saved = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {core})
    except (AttributeError, OSError, ValueError):  # no affinity on this platform, or a core that went away
        pass


def allowed() -> frozenset[int]:
    """The cores this process may use (a worker no longer placed gets them all back)."""
    _usable()
    return _allowed


def _count(step: int) -> None:
    global runs, _checked
    board = _open_board()
    with _lock:
        runs += step
        _checked = -(1 << 62)  # decide afresh at the next wait
        if board is not None:
            board.write(time.monotonic_ns(), runs, _core)


def may_spin() -> bool:
    """Whether a channel end of this process may poll before it blocks, now."""
    global _verdict, _checked
    if DISABLED:
        return False
    now = time.monotonic_ns()
    if now - _checked < CHECK_NS:
        return _verdict
    _checked = now
    _verdict = _decide(now)
    return _verdict


def _decide(now: int) -> bool:
    active = runs
    board = _open_board()
    if board is not None:  # whatever this process decides, the others see its runs
        board.write(now, active, _core)
    cpus = _usable()
    if DISABLED or cpus < 2:  # one core: the other end can only run when this one stops
        _place(None)
        return False
    running = _running()
    others, loads = board.others(now) if board is not None else (0, {})
    total = others + active
    calm = running is None or running <= cpus  # no more runnable threads than cores
    if active <= 1 and calm and total * 2 <= cpus:
        _place(None)
        return True
    # Our own interpreters fill the cores (not other work: then a pinned end could not move off a
    # busy core): keep each round trip's hand-offs on one core.
    ours = running is None or running <= max(cpus, total + 1)  # what runs is (about) our ends
    global _calm
    was = _core
    if PIN and active >= 1 and (active > 1 or total * 2 > cpus):
        # Hysteresis on other work (a one-off sample of the runnable count says little): placed after
        # CALM more decisions that saw none than saw some, unplaced when those that saw some catch up.
        _calm = min(_calm + 1, CALM) if ours else max(_calm - 1, 0)
        if _calm >= CALM or (_calm > 0 and was >= 0):
            _place(_choose(loads, board.slot if board is not None else None, active))
        else:
            _place(None)
    else:
        _place(None)
    if board is not None and _core != was:  # at once: a host deciding next sees this core taken
        board.write(now, active, _core)
    return False


def _usable() -> int:
    global _cpus, _allowed
    if not _cpus:
        try:
            _allowed = frozenset(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            _allowed = frozenset()
        _cpus = len(_allowed) or os.cpu_count() or 1
    return _cpus


def _choose(loads: dict[int, int], slot: int | None, runs: int) -> tuple[int, frozenset[int]] | None:
    """The core for this process's host threads (the least used by other host processes; ties split by
    slot, so two processes deciding at once part), and the cores for its workers."""
    cores = sorted(_allowed)
    if len(cores) < 2:
        return None
    use = {c: loads.get(c, 0) for c in cores}
    least = min(use.values())
    if _core in use and use[_core] <= least:
        core = _core  # stay put while no core is emptier
    else:
        ties = [c for c in cores if use[c] == least]
        core = ties[(slot if slot is not None else os.getpid()) % len(ties)]
    workers = frozenset({core}) if runs <= 1 else _allowed - {core}
    return core, workers


def _place(where: tuple[int, frozenset[int]] | None) -> None:
    global placement, _core
    if where != placement:
        placement = where
        _core = where[0] if where is not None else -1


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


class _Board:
    """The shared page: one slot per host process, written by its owner, read by everyone.

    Read and written with pread/pwrite, never mapped: anyone of this user (a process-mode program
    with `os`) can truncate the file, and a mapped page past a file's end is SIGBUS for every
    process touching it. A short read counts the missing slots as never used.
    """

    def __init__(self, fd: int, slot: int | None) -> None:
        self.fd, self.slot = fd, slot

    def write(self, now: int, runs: int, core: int = -1) -> None:
        if self.slot is not None:
            try:
                os.pwrite(self.fd, _FIELDS.pack(now, runs, core), self.slot * _SLOT)
            except OSError:  # a full or broken /dev/shm: the others just do not see this process
                pass

    def others(self, now: int) -> tuple[int, dict[int, int]]:
        """Active runs of the other host processes (those that wrote their slot within RECENT_NS), and
        those runs by the core their host threads are placed on."""
        try:
            data = os.pread(self.fd, _PAGE, 0)
        except OSError:
            return 0, {}
        whole = len(data) - len(data) % _SLOT
        view = memoryview(data)[:whole].cast("q")  # slot i's fields are items 8*i, 8*i + 1 and 8*i + 2
        total = 0
        loads: dict[int, int] = {}
        for i, at in enumerate(view[0::8].tolist()):  # slots never used hold 0: one test each
            if at and now - at < RECENT_NS and i != self.slot:
                runs = max(0, min(view[8 * i + 1], _SLOTS))  # runs as written, bounded
                total += runs
                core = view[8 * i + 2]
                if runs and core >= 0:
                    loads[core] = loads.get(core, 0) + runs
        return total, loads


def _open_board() -> _Board | None:
    global _board, _board_pid
    pid = os.getpid()
    if _board_pid == pid:
        return _board
    with _lock:
        if _board_pid != pid:
            _board, _board_pid = _make_board(), pid
    return _board


def _page_path() -> str:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    return os.path.join(base, f"proctor-hosts-{os.getuid()}")


def _make_board() -> _Board | None:
    """Open (or create) this user's page and claim a slot; None where that is not possible."""
    try:
        import fcntl
    except ImportError:  # not on Linux/Unix: decide from this process alone
        return None
    path = _page_path()
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise OSError("not this user's regular file")
        if info.st_size < _PAGE:
            os.ftruncate(fd, _PAGE)
    except OSError:
        os.close(fd)
        return None
    slot = None
    for i in range(_SLOTS):
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, _SLOT, i * _SLOT)
        except OSError:
            continue
        slot = i
        break
    # The fd stays open for the life of the process: closing any fd of the file would drop the lock.
    return _Board(fd, slot)
