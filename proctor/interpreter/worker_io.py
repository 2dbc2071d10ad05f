"""The worker's two outputs: the channel (frames, replies dispatched to waiting threads) and the log pipe.

Runs inside the worker: standard library only, no typing at run time.
"""

from __future__ import annotations

import _thread
import itertools
import os

from proctor.interpreter import channel as _channel
from proctor.interpreter.channel import BlockingReader, EncodeError, count_values, frame, write_all

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Channel", "Output"]


class Channel:
    """The worker's end: frames out under a lock; replies dispatched to waiting threads by id.

    `rfd` is the pipe the host's messages arrive on, `fd` the one this end's frames go out on.
    """

    def __init__(self, rfd: int, fd: int) -> None:
        self.fd = fd
        self._send_lock = _thread.allocate_lock()
        self._lock = _thread.allocate_lock()
        self._waiters: dict[Any, Any] = {}  # key -> lock released when the message arrives
        self._inbox: dict[Any, dict[str, Any]] = {}
        self._reading = False
        self.run_open = False
        self.ids = itertools.count(1)  #: request ids, 1, 2, 3…
        self._reader = BlockingReader(rfd)

    def send(self, message: dict[str, Any]) -> None:
        self.send_bytes(self.build(message))

    @staticmethod
    def build(message: dict[str, Any]) -> bytes:
        """The frame of `message`, within the host's limits (`EncodeError` otherwise: the host
        would take a frame over them for a hostile worker's, and stop this one)."""
        data = frame(message)
        containers, values = _channel.MAX_CONTAINERS, _channel.MAX_VALUES
        if len(data) > min(containers, (values - 1) // 2):
            n, v = count_values(data, containers, values)
            if n > containers or v > values:
                raise EncodeError(f"message holds more than {containers:,} lists and dicts or {values:,} values")
        return data

    def send_bytes(self, data: bytes) -> None:
        """Send a built frame whole (frames from threads never interleave)."""
        with self._send_lock:
            write_all(self.fd, data)

    def send_in_run(self, data: bytes) -> bool:
        """Send a frame that belongs to the running program (a call, a final answer) only while it runs.

        Checked under the send lock, which `close_run` also takes: once the worker has closed a
        run, no thread can put a message for it on the channel behind the run's ``done``.
        """
        with self._send_lock:
            if not self.run_open:
                return False
            write_all(self.fd, data)
            return True

    def open_run(self) -> None:
        with self._send_lock:
            self.run_open = True

    def close_run(self) -> None:
        with self._send_lock:
            self.run_open = False

    def next_id(self) -> int:
        return next(self.ids)

    def wait(self, key: Any) -> dict[str, Any]:
        """Block until the message for `key` (a request id, or "ctl") arrives; one thread reads at a time."""
        while True:
            with self._lock:
                if key in self._inbox:
                    return self._inbox.pop(key)
                if self._reading:
                    gate = _thread.allocate_lock()
                    gate.acquire()
                    self._waiters[key] = gate
                else:
                    self._reading = True
                    gate = None
            if gate is not None:
                gate.acquire()  # woken when our message arrived or the reader left
                continue
            try:
                while True:
                    message = self._reader.recv()
                    if message is None:
                        os._exit(0)  # the host closed the channel: nothing left to do
                    mkey = message.get("id", "ctl") if message.get("t") == "reply" else "ctl"
                    if mkey == key:
                        return message
                    with self._lock:
                        self._inbox[mkey] = message
                        waiter = self._waiters.pop(mkey, None)
                    if waiter is not None:
                        waiter.release()
            finally:
                with self._lock:
                    self._reading = False
                    if self._waiters:  # threads waiting for their replies: one of them reads next
                        for waiter in self._waiters.values():
                            waiter.release()
                        self._waiters.clear()


class Output:
    """sys.stdout/sys.stderr of the program: buffered writes to the log pipe, cut after `limit` characters."""

    def __init__(self, fd: int, limit: int) -> None:
        self.fd, self.limit = fd, limit
        self.written = 0
        self.cut = False
        self._parts: list[str] = []
        self._size = 0
        self._lock = _thread.allocate_lock()

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            room = self.limit - self.written
            if room <= 0:
                self.cut = self.cut or bool(text)
                return len(text)
            if len(text) > room:
                self.cut = True
            part = text[:room]
            self.written += len(part)
            self._parts.append(part)
            self._size += len(part)
            # Line by line (and every 8 KiB): what was printed before a timeout kill is in the pipe.
            if self._size > 8192 or "\n" in part:
                self._flush_locked()
        return len(text)

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if not self._parts:
            return
        data = memoryview("".join(self._parts).encode("utf-8", "replace"))
        self._parts.clear()
        self._size = 0
        while data:
            data = data[os.write(self.fd, data):]

    def reset(self) -> None:
        with self._lock:
            self._flush_locked()
            self.written, self.cut = 0, False

    def isatty(self) -> bool:
        return False

    encoding = "utf-8"
