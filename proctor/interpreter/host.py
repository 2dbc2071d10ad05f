"""The host's handle on one worker process: start it, talk to it, read its logs, kill it.

Everything read from the worker is untrusted: frames go through `FrameReader` (size
checked before anything is buffered, JSON only), logs are capped, and the handle
never blocks on the worker — every read is a poll with a deadline.
"""

from __future__ import annotations

import math
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from typing import Any

from proctor.errors import SandboxError, WorkerDied
from proctor.interpreter import spinning
from proctor.interpreter.channel import ProtocolError, frame
from proctor.interpreter.limits import ChannelLimits, HostFrameReader
from proctor.interpreter.sandbox import SandboxSpec, spawn

try:  # the channel's reads and writes holding the GIL (setup.py); without a compiler, os.read / os.write
    from proctor._pipeio import read as _read_now
    from proctor._pipeio import write as _write_now
except ImportError:  # pragma: no cover - an install that could not build the extension
    _read_now, _write_now = os.read, os.write

#: Bytes asked of the channel per read. Not more: CPython allocates the whole size before
#: reading, and past glibc's mmap threshold (128 KiB) that is an mmap/munmap pair per call
#: (measured: 13.8 µs per recv at 256 KiB against 2.4 µs at 64 KiB).
_RECV = 1 << 16

__all__ = ["SeenIds", "WorkerDied", "WorkerProcess"]


class SeenIds:
    """The request ids a worker has used, in memory that does not grow with the calls it makes.

    A worker numbers its requests 1, 2, 3… (threads may send them slightly out of order): ids up
    to `upto` have all been seen, and the few seen above it wait in `above` until the gap closes.
    A worker that skips more than `MAX_GAPS` numbers breaks the protocol.
    """

    __slots__ = ("above", "upto")

    MAX_GAPS = 4096

    def __init__(self) -> None:
        self.upto = 0
        self.above: set[int] = set()

    def __contains__(self, request_id: object) -> bool:
        return isinstance(request_id, int) and (request_id <= self.upto or request_id in self.above)

    def __len__(self) -> int:
        return self.upto + len(self.above)

    def take(self, request_id: int) -> bool:
        """Note `request_id` as used; False if it was used before. (One call on every tool call's
        path: the usual next id in order is two comparisons and a store.)"""
        if request_id == self.upto + 1 and not self.above:
            self.upto = request_id
            return True
        if request_id in self:
            return False
        self.add(request_id)
        return True

    def add(self, request_id: int) -> None:
        """Note `request_id` as used (the caller has checked it was not)."""
        if request_id != self.upto + 1:
            self.above.add(request_id)
            if len(self.above) > self.MAX_GAPS:
                raise ProtocolError(f"request ids skip more than {self.MAX_GAPS} numbers")
            return
        self.upto = request_id
        above = self.above
        while above and self.upto + 1 in above:
            above.remove(self.upto + 1)
            self.upto += 1


class WorkerProcess:
    """One running worker, its channel (two pipes, one each way), its log pipe and its diagnostics pipe.

    Pipes, not a socketpair: a round trip over two pipes costs about 5.6 µs of CPU on one core against
    about 9 µs over a Unix stream socket (both ends in Python, blocked in poll/read; see
    docs/benchmarks.md, "Where a call's CPU goes"), and a reader blocked on one pipe is woken only by
    writes to it, never by the other end reading (a socket's one wait queue did that: two wake-ups a call).
    """

    def __init__(self, spec: SandboxSpec, init: dict[str, Any], *, log_cap: int,
                 limits: ChannelLimits | None = None) -> None:
        self.spec = spec
        self.log_cap = log_cap
        self.started = time.perf_counter()
        self.ready_at: float | None = None
        self.pid: int | None = None
        self.seen_ids = SeenIds()
        self.logs = bytearray()
        self.logs_cut = False
        self.diag = bytearray()
        self._reader = HostFrameReader(limits or ChannelLimits())
        #: Whether this end might poll before blocking at its last wait; replies tell the worker the same.
        self.spin = True
        #: While a run serves a call: the run's time left when the call came (seconds). A reply the worker
        #: does not take within that much of being written is not waited for longer (the tool's or a
        #: human's time does not count, the worker's does).
        self.write_left: float | None = None
        self._dead = False
        self._frozen: list[int] = []
        self._tmp = tempfile.TemporaryDirectory(prefix="proctor-worker-") if spec.isolation != "bwrap" else None
        to_r, to_w = os.pipe()  # host -> worker
        from_r, from_w = os.pipe()  # worker -> host
        log_r, log_w = os.pipe()
        diag_r, diag_w = os.pipe()
        try:
            self.proc = spawn(spec, (to_r, from_w), log_w, diag_w, self._tmp.name if self._tmp else None)
        except BaseException:
            for fd in (to_w, from_r, log_r, diag_r):
                os.close(fd)
            raise
        finally:
            for fd in (to_r, from_w, log_w, diag_w):
                os.close(fd)
        # The host's ends as unbuffered files: closing them twice (kill, then the finalizer) is harmless,
        # where a second os.close could close an fd number the process has reused since.
        self._out = open(to_w, "wb", buffering=0, closefd=True)
        self._in = open(from_r, "rb", buffering=0, closefd=True)
        self._out_fd, self._in_fd = to_w, from_r
        self.log_fd, self.diag_fd = log_r, diag_r
        for fd in (to_w, from_r, log_r, diag_r):
            os.set_blocking(fd, False)
        self._poll = select.poll()
        for fd in (from_r, log_r, diag_r):
            self._poll.register(fd, select.POLLIN)
        self._finalizer = weakref.finalize(self, _shutdown, self.proc, (self._out, self._in), (log_r, diag_r),
                                           self._tmp)
        self.send(init)

    # -- talking ---------------------------------------------------------------------------------

    def send(self, message: dict[str, Any], timeout: float = 10.0) -> None:
        """Write one frame; the worker must take it within `timeout` seconds."""
        self.send_bytes(frame(message), timeout)

    def send_bytes(self, raw: bytes, timeout: float = 10.0) -> None:
        """Write an already-built frame."""
        if self._dead:  # its fds are closed, and their numbers may belong to other files by now
            raise WorkerDied("the worker is gone")
        data: bytes | memoryview = raw
        end: float | None = None  # the clock is read only if the worker is slow to take it
        while data:
            try:
                # Holding the GIL: the fd is non-blocking, so the write cannot wait, and letting go of the
                # GIL would hand it to another host thread and make this one wait for it (`proctor._pipeio`).
                sent = _write_now(self._out_fd, data)
            except BlockingIOError:
                if end is None:
                    limit = self.write_left
                    end = time.monotonic() + (timeout if limit is None else min(timeout, limit))
                left = end - time.monotonic()
                if left <= 0:
                    raise SandboxError("the worker stopped reading its channel") from None
                select.select([], [self._out_fd], [], left)
                continue
            except OSError as exc:
                raise WorkerDied(f"channel closed: {exc}") from None
            # The usual case is one send of the whole frame; only a partial one is sliced (no copy).
            data = memoryview(data)[sent:] if sent < len(data) else b""

    def read(self, timeout: float) -> list[tuple[int, Any]]:
        """``(frame size, message)`` for the messages that arrive within `timeout` (maybe none); logs
        are drained on the way. A message is a JSON object, or an `OversizedCall` refused by its size.

        Raises `ProtocolError` for a bad frame and `WorkerDied` when the channel closed.
        """
        if self._dead:
            raise WorkerDied("the worker is gone")
        try:
            # One poll that blocks (it returns at once when a message is there already), after polling for a
            # while only when this run is alone (see `spinning`): otherwise every look would be a system call
            # for nothing, and in a process of several runs a turn of the GIL.
            events = None
            self.spin = spin = spinning.may_spin()
            if spin:
                spin_until = time.perf_counter_ns() + spinning.SPIN_NS
                while True:
                    events = self._poll.poll(0)
                    if events or time.perf_counter_ns() >= spin_until:
                        break
            if not events:
                events = self._poll.poll(max(0, math.ceil(timeout * 1000)))
        except InterruptedError:
            return []
        messages: list[tuple[int, Any]] = []
        channel = False
        for fd, _ in events:
            if fd == self._in_fd:
                channel = True
            elif fd == self.log_fd:
                self.drain_logs()
            elif fd == self.diag_fd:
                self._drain(self.diag_fd, self.diag, 8192, keep_tail=True)
        if channel:
            for _ in range(256):  # bounded: a flooding worker cannot keep the host here forever
                try:
                    chunk = _read_now(self._in_fd, _RECV)  # holding the GIL, as `send_bytes` writes
                except BlockingIOError:
                    break
                except OSError as exc:
                    raise WorkerDied(f"channel error: {exc}") from None
                if not chunk:
                    self._drain_logs()
                    raise WorkerDied("the worker closed its channel")
                messages += self._reader.feed(chunk)
                if len(chunk) < _RECV:
                    break  # most likely all there is; poll says when more comes
        return messages

    def drain_logs(self) -> None:
        if self._dead:
            return  # the fds may already be closed (and their numbers reused) by the reaper
        self._drain_logs()

    def _drain_logs(self) -> None:
        cut = self._drain(self.log_fd, self.logs, self.log_cap, keep_tail=False)
        self.logs_cut = self.logs_cut or cut

    @staticmethod
    def _drain(fd: int, buf: bytearray, cap: int, *, keep_tail: bool) -> bool:
        cut = False
        for _ in range(256):
            try:
                chunk = os.read(fd, 1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            if not chunk:
                break
            if keep_tail:
                buf += chunk
                del buf[: max(0, len(buf) - cap)]
            else:
                room = cap - len(buf)
                if len(chunk) > room:
                    cut = True
                buf += chunk[: max(room, 0)]
        return cut

    # -- between runs ----------------------------------------------------------------------------

    def freeze(self) -> None:
        """Stop every process of the worker (SIGSTOP, all threads): no program code runs between runs.

        Top-down: a process is stopped before its children are listed, so none can be added behind
        the walk. In process-only mode a child that double-forked away from the tree escapes this
        (as it escapes the kill); under bubblewrap no process can be created.
        """
        if self._dead or self._frozen:
            return
        stopped: list[int] = []
        todo = [self.proc.pid]
        while todo:
            pid = todo.pop()
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                continue
            stopped.append(pid)
            todo += _children(pid)
        self._frozen = stopped

    def thaw(self) -> None:
        """Let the worker run again (SIGCONT to what `freeze` stopped); call it right before a run starts."""
        frozen, self._frozen = self._frozen, []
        if self._dead:
            return
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass

    @property
    def frozen(self) -> bool:
        return bool(self._frozen)

    # -- life and death --------------------------------------------------------------------------

    def kill(self) -> None:
        """Close the channel, then SIGKILL the worker's process group (the whole sandbox)."""
        if self._dead:
            return
        self._dead = True
        _close(self._out, self._in)
        for pid in self._frozen:  # stopped processes die of SIGKILL too; do not leave them to bwrap
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _kill_group(self.proc)
        self._drain_logs()
        threading.Thread(target=self._reap, name="proctor-reaper", daemon=True).start()

    def _reap(self) -> None:
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self._finalizer()

    def close(self) -> None:
        self.kill()

    def exit_description(self) -> str:
        """How the worker ended, for error messages (signal, exit code, last diagnostics)."""
        code = self.proc.poll()
        if code is None:
            try:
                code = self.proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                code = None
        if code is None:
            what = "is unresponsive"
        elif code < 0:
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            what = f"was killed by {name}"
            if -code in (signal.SIGKILL, signal.SIGSEGV):
                what += " (out of memory, or a CPU/memory limit)"
            elif -code == getattr(signal, "SIGXCPU", -1):
                what += " (CPU time limit)"
        else:
            what = f"exited with status {code}"
        tail = self.diag.decode("utf-8", "replace").strip().splitlines()[-1:] if self.diag else []
        return what + (f"; last diagnostic: {tail[0][:300]}" if tail else "")

    @property
    def dead(self) -> bool:
        return self._dead


def _children(pid: int) -> list[int]:
    """The child processes of `pid` (from every thread's /proc children list)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                out += [int(c) for c in fh.read().split()]
        except (OSError, ValueError):
            continue
    return out


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except OSError:
            pass


def _close(*files: Any) -> None:
    for f in files:
        try:
            f.close()
        except OSError:
            pass


def _shutdown(proc: subprocess.Popen[bytes], channel: tuple[Any, Any], fds: tuple[int, ...],
              tmp: tempfile.TemporaryDirectory[str] | None) -> None:
    """Last-resort cleanup (also run when a handle is garbage-collected): nothing is left running."""
    _close(*channel)
    if proc.poll() is None:
        _kill_group(proc)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    if tmp is not None:
        tmp.cleanup()

