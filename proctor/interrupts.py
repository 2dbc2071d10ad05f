"""Interrupts a run can record: Ctrl-C arrives as `KeyboardInterrupt`; SIGTERM, by default, kills
the process before anything is written. `terminate_as_exception` turns SIGTERM into `Terminated`
(a `SystemExit` with status 143) while a run lasts, so the gate and the agent record how every call
and the run ended — then the exception goes on and the process exits as it would have.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from proctor.errors import Terminated

__all__ = ["Terminated", "interruption", "terminate_as_exception"]


def interruption(exc: BaseException) -> str:
    """How an interrupt is named in records: the signal (SIGINT, SIGTERM), or the exception's type."""
    signum = getattr(exc, "signum", None)
    if isinstance(signum, int):
        try:
            return signal.Signals(signum).name
        except ValueError:
            return f"signal {signum}"
    if isinstance(exc, KeyboardInterrupt):
        return "SIGINT"
    return type(exc).__name__


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


@contextmanager
def terminate_as_exception(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """While inside, a signal in `signals` that would kill the process raises `Terminated` instead.

    Only in the main thread (where Python runs signal handlers), and only for signals left at
    their default: a handler the application installed is kept as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    installed: dict[int, object] = {}
    for signum in signals:
        try:
            if signal.getsignal(signum) is signal.SIG_DFL:
                installed[signum] = signal.signal(signum, _raise)
        except (OSError, ValueError):  # not available on this platform
            continue
    try:
        yield
    finally:
        for signum, previous in installed.items():
            if signal.getsignal(signum) is _raise:
                signal.signal(signum, previous)  # type: ignore[arg-type]
