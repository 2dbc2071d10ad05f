"""Who may poll the channel before blocking: only a run that is alone in its process and on its machine."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pytest

from proctor.interpreter import Interpreter, spinning
from proctor.interpreter import interpreter as interpreter_module
from proctor.interpreter.channel import BlockingReader, frame, reply_frame


@pytest.fixture
def idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two usable cores, an otherwise idle machine and no run in progress, for this test alone."""
    monkeypatch.setattr(spinning, "_cpus", 2)
    monkeypatch.setattr(spinning, "_running", lambda: 1)
    monkeypatch.setattr(spinning, "runs", 0)
    monkeypatch.setattr(spinning, "_checked", -(1 << 62))
    monkeypatch.setattr(spinning, "_quiet_from", -(1 << 62))


def _fresh() -> bool:
    spinning._checked = -(1 << 62)
    return spinning.may_spin()


def test_one_run_spins_and_a_second_run_in_the_process_stops_it(idle: None) -> None:
    """A lone run may spin; with two runs in progress in one process neither does, until one ends."""
    spinning.enter()
    try:
        assert _fresh() is True
        spinning.enter()
        assert spinning.may_spin() is False  # at once: not only at the next look at the machine
        spinning.leave()
        assert _fresh() is True
    finally:
        spinning.leave()
    assert spinning.runs == 0


def test_a_busy_machine_or_one_core_stops_spinning(idle: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """More runnable threads than cores (other runs waiting), or a single core, and a lone run blocks at once."""
    spinning.enter()
    try:
        monkeypatch.setattr(spinning, "_running", lambda: 3)
        assert _fresh() is False
        monkeypatch.setattr(spinning, "_running", lambda: 2)
        monkeypatch.setattr(spinning, "_quiet_from", -(1 << 62))  # QUIET_NS since that busy look
        assert _fresh() is True
        monkeypatch.setattr(spinning, "_cpus", 1)
        assert _fresh() is False
    finally:
        spinning.leave()


def test_one_quiet_look_after_a_busy_one_does_not_restart_spinning(idle: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another run whose ends are both between hand-offs is not runnable at that instant: a lone run spins again
    only once every look for `QUIET_NS` has seen no more runnable threads than cores."""
    now = [10**12]
    monkeypatch.setattr(spinning.time, "monotonic_ns", lambda: now[0])
    running = [3]
    monkeypatch.setattr(spinning, "_running", lambda: running[0])
    spinning.enter()
    try:
        assert _fresh() is False
        running[0] = 2
        for _ in range(3):  # quiet looks within QUIET_NS of the busy one
            now[0] += spinning.QUIET_NS // 4
            assert _fresh() is False
        now[0] += spinning.QUIET_NS // 4
        assert _fresh() is True
        running[0] = 3  # busy again: at once
        now[0] += spinning.CHECK_NS
        assert spinning.may_spin() is False
    finally:
        spinning.leave()


def test_disabled_never_spins(idle: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spinning, "DISABLED", True)
    spinning.enter()
    try:
        assert _fresh() is False
    finally:
        spinning.leave()


def test_the_machine_is_read_from_proc_loadavg() -> None:
    """The runnable count comes from /proc/loadavg here (Linux): at least this thread."""
    running = spinning._running()
    assert running is not None and running >= 1


def test_replies_tell_the_worker_whether_to_spin() -> None:
    """A reply saying "spin": false makes the worker's reader block at once until a message says otherwise."""
    assert reply_frame(7, "a", False) == frame({"t": "reply", "id": 7, "ok": True, "value": "a", "spin": False})
    host, worker = socket.socketpair()
    try:
        reader = BlockingReader(worker.fileno())
        host.sendall(reply_frame(1, "a", False))
        assert reader.recv() == {"t": "reply", "id": 1, "ok": True, "value": "a", "spin": False}
        assert reader.spin is False
        host.sendall(reply_frame(2, "b"))
        assert reader.recv() == {"t": "reply", "id": 2, "ok": True, "value": "b"}
        assert reader.spin is True
    finally:
        host.close()
        worker.close()


def test_a_call_slower_than_the_worker_spin_window_is_answered_without_spinning(
        idle: None, make: Callable[..., Interpreter], monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker polls for its next reply only while replies come within its spin window: the answer to a
    call that took longer (an MCP server's millisecond) says "spin": false, so the worker blocks at once for
    the next call's (most often the same tool's) instead of polling for nothing; the answer to a quick call
    says spin again. (The window is widened to 20 ms here so that a loaded machine cannot make a quick call slow.)"""
    sent: list[tuple[int, bool]] = []

    def recorded(rid: int, value: Any, spin: bool = True) -> bytes:
        sent.append((rid, spin))
        return reply_frame(rid, value, spin)

    monkeypatch.setattr(interpreter_module, "reply_frame", recorded)
    monkeypatch.setattr(interpreter_module, "_SPIN_S", 0.02)
    py = make(sandbox="process")
    py.run("lookup(order='warm')")  # the first call of all also pays for what is set up once (> the window)
    sent.clear()
    r = py.run("lookup(order='a')\nslow(seconds=0.05)\nlookup(order='b')\nslow(seconds=0.05)\n'done'")
    assert r.error is None and r.value == "done", r.error
    assert [spin for _, spin in sent] == [True, False, True, False]
