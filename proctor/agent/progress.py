"""The live line `proctor run` shows while a step's program runs: step, calls so far, last call, time.

Only on a terminal: when the stream is not one (a pipe, a file, CI logs) `ProgressLine`
writes nothing at all, so captured output holds no carriage returns or escape sequences.
On a terminal it redraws one line in place (``\\r`` + erase-line) a few times a second
and erases it before anything else is printed: the step's calls table (`stop`, a step
callback) and an approval prompt (`paused`, around the approver). The line is cut to
the terminal's width, so it never wraps (a wrapped line could not be redrawn in place),
and a tool name in it goes through `proctor.termsafe.terminal_safe`.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from proctor.agent.result import StepRecord
from proctor.approval.base import ApprovalDecision, ApprovalRequest, Approver
from proctor.calls import CallRecord
from proctor.termsafe import terminal_safe

__all__ = ["PausingApprover", "ProgressLine"]

_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
_ERASE = "\r\x1b[2K"


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):  # closed or not a real stream
        return False


class ProgressLine:
    """A one-line status under the program while it runs (see the module docstring).

    Hooks: `start` as a program callback (after the program is printed), `call` as a call
    listener ``(step, CallRecord)``, `stop` as the first step callback. `interval` is
    seconds between redraws.
    """

    def __init__(self, stream: IO[str], *, interval: float = 0.2, enabled: bool | None = None) -> None:
        self.stream = stream
        self.interval = interval
        self.enabled = _is_terminal(stream) if enabled is None else enabled
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._step = 0
        self._calls = 0
        self._refused = 0
        self._last = ""
        self._began = 0.0
        self._paused = 0
        self._shown = False
        self._waiting = ""

    # -- hooks -----------------------------------------------------------------------------------

    def start(self, step: StepRecord) -> None:
        """The step's program starts: show the line until `stop`."""
        if not self.enabled or step.code is None:
            return
        self.stop()
        with self._lock:
            self._step, self._calls, self._refused, self._last = step.number, 0, 0, ""
            self._began = time.monotonic()
            self._wake.clear()
            self._thread = threading.Thread(target=self._loop, name="proctor-progress", daemon=True)
            self._thread.start()

    def call(self, step: int, record: CallRecord) -> None:
        """A call of the program was settled: count it, and name it on the line."""
        with self._lock:
            self._calls += 1
            if record.status != "ok":
                self._refused += 1
            self._last = f"{record.tool} {record.status}"

    def stop(self, step: StepRecord | None = None) -> None:
        """The program ended: erase the line (before the step's calls are printed)."""
        thread = self._thread
        if thread is None:
            return
        self._wake.set()
        thread.join()
        with self._lock:
            self._thread = None
            self._erase()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Erase the line and keep it away while something else uses the terminal (an approval prompt)."""
        with self._lock:
            self._paused += 1
            self._erase()
        try:
            yield
        finally:
            with self._lock:
                self._paused -= 1

    @contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """Say on the line what the program waits for (an approval asked elsewhere: a webhook, an inbox)."""
        with self._lock:
            self._waiting = what
        try:
            yield
        finally:
            with self._lock:
                self._waiting = ""

    # -- drawing ---------------------------------------------------------------------------------

    def text(self, width: int) -> str:
        """The line as drawn now, at most `width - 1` characters."""
        elapsed = time.monotonic() - self._began
        frame = _FRAMES[int(elapsed / max(self.interval, 0.05)) % len(_FRAMES)]
        calls = f"{self._calls} call{'s' if self._calls != 1 else ''}"
        if self._refused:
            calls += f" ({self._refused} not ok)"
        line = f"{frame} step {self._step}: program running · {calls} · {elapsed:.1f}s"
        if self._waiting:
            line += f" · {terminal_safe(self._waiting)}"
        elif self._last:
            line += f" · last: {terminal_safe(self._last)}"
        limit = max(width - 1, 10)
        return line if len(line) <= limit else line[: limit - 1] + "…"

    def _loop(self) -> None:
        while not self._wake.is_set():
            with self._lock:
                if not self._paused:
                    width = shutil.get_terminal_size((80, 24)).columns
                    self._write(_ERASE + self.text(width))
                    self._shown = True
            self._wake.wait(self.interval)

    def _erase(self) -> None:
        if self._shown:
            self._write(_ERASE)
            self._shown = False

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: the run goes on without the line
            self.enabled = False


class PausingApprover:
    """An approver that keeps the progress line out of the way of the approver it wraps.

    One that asks at this terminal (`terminal=True`, the console approver) gets the line erased
    while it asks; one that asks elsewhere (a webhook, an inbox) leaves the line up, saying what
    the program waits for. Made with `around`, it carries the wrapped approver's class name: the
    gate names approvers by their type in audit records and messages ("no answer from
    ConsoleApprover …").
    """

    def __init__(self, approver: Approver, progress: ProgressLine, *, terminal: bool = True) -> None:
        self.approver = approver
        self.progress = progress
        self.terminal = terminal

    @classmethod
    def around(cls, approver: Approver, progress: ProgressLine, *, terminal: bool = True) -> PausingApprover:
        named: type[PausingApprover] = type(type(approver).__name__, (cls,), {"__module__": cls.__module__})
        return named(approver, progress, terminal=terminal)

    def request(self, request: ApprovalRequest) -> ApprovalDecision:
        if self.terminal:
            with self.progress.paused():
                return self.approver.request(request)
        with self.progress.waiting(f"waiting for approval of {request.tool}"):
            return self.approver.request(request)

    def __getattr__(self, name: str) -> Any:  # store, timeout…: whatever the gate or agent reads of it
        if name == "approver":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.approver, name)
