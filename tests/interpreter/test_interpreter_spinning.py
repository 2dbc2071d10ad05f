"""Tests for who may spin on the channel: only an interpreter that has the machine's cores to itself."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from proctor.interpreter import spinning
from proctor.interpreter.channel import BlockingReader, frame, reply_frame
from proctor.interpreter.host import _tree


@pytest.fixture
def page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private shared page, two usable cores and an otherwise idle machine, for this test alone."""
    path = tmp_path / "hosts"
    monkeypatch.setattr(spinning, "_page_path", lambda: str(path))
    monkeypatch.setattr(spinning, "_board", None)
    monkeypatch.setattr(spinning, "_board_pid", 0)
    monkeypatch.setattr(spinning, "_cpus", 2)
    monkeypatch.setattr(spinning, "_running", lambda: 1)
    monkeypatch.setattr(spinning, "runs", 0)
    monkeypatch.setattr(spinning, "_checked", -(1 << 62))
    monkeypatch.setattr(spinning, "placement", None)
    monkeypatch.setattr(spinning, "_core", -1)
    monkeypatch.setattr(spinning, "_calm", 0)
    monkeypatch.setattr(spinning, "CALM", 1)
    yield path
    board = spinning._board
    if board is not None:
        os.close(board.fd)  # drops this test's slot lock


def _fresh() -> bool:
    spinning._checked = -(1 << 62)
    return spinning.may_spin()


def test_one_run_spins_and_a_second_run_in_the_process_stops_it(page: Path) -> None:
    """A lone run may spin; with two runs in progress in one process neither does, until one ends."""
    spinning.enter()
    try:
        assert _fresh() is True
        spinning.enter()
        assert _fresh() is False
        spinning.leave()
        assert _fresh() is True
    finally:
        spinning.leave()


def test_a_run_in_another_host_process_stops_spinning(page: Path) -> None:
    """Another process's active run, seen through the shared page, stops this one spinning; its end restarts it."""
    code = textwrap.dedent(f"""
        import sys
        from proctor.interpreter import spinning
        spinning._page_path = lambda: {str(page)!r}
        spinning.enter()
        print("in", spinning._board.slot, flush=True)
        sys.stdin.readline()
        spinning.leave()
        print("out", flush=True)
        sys.stdin.readline()
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline().startswith("in ")
        spinning.enter()
        try:
            assert spinning._board is not None and spinning._board.slot is not None
            assert _fresh() is False
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "out"
            assert _fresh() is True
        finally:
            spinning.leave()
    finally:
        child.stdin.close()
        child.wait(timeout=60)
        child.stdout.close()


def test_a_busy_machine_or_one_core_stops_spinning(page: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """More runnable threads than cores, or a single core, and a lone run blocks at once."""
    spinning.enter()
    try:
        monkeypatch.setattr(spinning, "_running", lambda: 3)
        assert _fresh() is False
        monkeypatch.setattr(spinning, "_running", lambda: 2)
        assert _fresh() is True
        monkeypatch.setattr(spinning, "_cpus", 1)
        assert _fresh() is False
    finally:
        spinning.leave()


def test_a_page_owned_by_someone_else_is_not_used(page: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A symlink planted at the page's path is not followed: the host decides from its own process alone."""
    target = page.parent / "elsewhere"
    target.write_bytes(b"")
    page.symlink_to(target)
    assert spinning._make_board() is None
    assert target.read_bytes() == b""


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


def test_a_busy_process_still_shows_its_runs_to_the_others(page: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that does not spin (two runs, or a loaded machine) keeps writing its runs for the other hosts."""
    spinning.enter()
    spinning.enter()
    try:
        monkeypatch.setattr(spinning, "_running", lambda: 9)
        board = spinning._board
        assert board is not None and board.slot is not None
        board.write(1, 0)  # as if its slot had gone stale
        assert _fresh() is False
        at, runs, _ = struct.unpack_from("<qqq", os.pread(board.fd, 64, 64 * board.slot))
        assert runs == 2 and at > 1
    finally:
        spinning.leave()
        spinning.leave()


def _cores_of(pid: int) -> set[int]:
    return set(os.sched_getaffinity(pid))


def test_two_host_processes_that_may_not_spin_take_a_core_each(page: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two host processes with a run each, on two cores, keep each host and its worker on a core of its own."""
    monkeypatch.setattr(spinning, "_allowed", frozenset({0, 1}))
    code = textwrap.dedent(f"""
        import sys
        from proctor.interpreter import spinning
        spinning._page_path = lambda: {str(page)!r}
        spinning._cpus, spinning._allowed, spinning._running, spinning.CALM = 2, frozenset({{0, 1}}), lambda: 1, 1
        spinning.enter()
        print("in", flush=True)
        sys.stdin.readline()
        spinning._checked = -(1 << 62)
        print(spinning.may_spin(), spinning.placement, flush=True)
        sys.stdin.readline()
        spinning.leave()
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline().strip() == "in"
        spinning.enter()
        try:
            assert _fresh() is False
            assert spinning.placement is not None
            mine, workers = spinning.placement
            assert workers == {mine}
            child.stdin.write("\n")
            child.stdin.flush()
            spin, theirs = child.stdout.readline().strip().split(" ", 1)
            assert spin == "False" and theirs == repr((1 - mine, frozenset({1 - mine})))
        finally:
            spinning.leave()
    finally:
        child.stdin.close()
        child.wait(timeout=60)
        child.stdout.close()


def test_a_process_of_many_runs_keeps_its_hosts_on_one_core_and_workers_off_it(
        page: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several runs in one process (one GIL): host threads share a core, their workers get the others."""
    monkeypatch.setattr(spinning, "_allowed", frozenset({0, 1, 2}))
    monkeypatch.setattr(spinning, "_cpus", 3)
    spinning.enter()
    spinning.enter()
    try:
        assert _fresh() is False
        assert spinning.placement is not None
        host, workers = spinning.placement
        assert host in {0, 1, 2} and workers == {0, 1, 2} - {host}
    finally:
        spinning.leave()
        spinning.leave()
    assert _fresh() is True and spinning.placement is None


def test_other_work_on_the_machine_or_pin_off_leaves_ends_where_the_scheduler_puts_them(
        page: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine busy with other work (a pinned end could not leave a busy core), or PIN = False: nothing is placed."""
    monkeypatch.setattr(spinning, "_allowed", frozenset({0, 1}))
    spinning.enter()
    spinning.enter()
    try:
        assert _fresh() is False and spinning.placement is not None
        monkeypatch.setattr(spinning, "_running", lambda: 9)
        assert _fresh() is False and spinning.placement is None
        monkeypatch.setattr(spinning, "_running", lambda: 1)
        monkeypatch.setattr(spinning, "PIN", False)
        assert _fresh() is False and spinning.placement is None
    finally:
        spinning.leave()
        spinning.leave()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="placing channel ends needs two usable cores")
@pytest.mark.parametrize("sandbox", ["process", "bwrap"])
def test_a_placed_run_pins_its_host_thread_and_worker_and_gives_the_cores_back(
        page: Path, monkeypatch: pytest.MonkeyPatch, sandbox: str) -> None:
    """While a placed run serves calls its tools run on the host core and the worker on the others; afterwards
    both have every core again."""
    from proctor.gate import Gate
    from proctor.interpreter import Interpreter
    from proctor.policy import Policy
    from proctor.tools import tool

    seen: list[set[int]] = []
    worker_seen: list[set[int]] = []
    pids: list[int] = []

    @tool(side_effect="read")
    def where() -> str:
        """Say where this tool runs."""
        seen.append(set(os.sched_getaffinity(0)))
        worker_seen.append(set.union(*(_cores_of(pid) for pid in pids)))
        return "here"

    everything = _cores_of(0)
    monkeypatch.setattr(spinning, "_allowed", frozenset(everything))
    monkeypatch.setattr(spinning, "_cpus", len(everything))
    rule = {"name": "ok", "match": {"tool": "where"}, "decision": "allow"}
    policy = Policy.from_dict({"version": 1, "rules": [rule]})
    with Interpreter([where], Gate(policy, tools=[where]), sandbox=sandbox) as py:  # type: ignore[arg-type]
        assert py._worker is not None
        worker = py._worker.proc.pid
        pids.extend(_tree(worker))  # under bubblewrap: bwrap, its pid 1 and the worker
        assert len(pids) >= (2 if sandbox == "bwrap" else 1)
        spinning.enter()  # a second run in this process: the cores are scarce, ends are placed
        try:
            result = py.run("where()\nwhere()")
            assert result.error is None, result.error
            assert spinning.placement is not None
            host, workers = spinning.placement
            assert seen == [{host}, {host}] and worker_seen == [workers, workers]
            assert py._worker is not None and py._worker.proc.pid == worker
        finally:
            spinning.leave()
        assert _cores_of(0) == everything and all(_cores_of(pid) == everything for pid in pids)
    assert workers == everything - {host}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="placing channel ends needs two usable cores")
def test_a_thread_gets_its_own_cores_back_when_its_outermost_run_ends(page: Path) -> None:
    """A run inside a run in one thread (a tool running another interpreter) keeps it placed until the outer ends."""
    everything = _cores_of(0)
    core = min(everything)
    spinning.enter()
    try:
        spinning.pin_thread(core)
        spinning.enter()
        spinning.leave()
        assert _cores_of(0) == {core}
    finally:
        spinning.leave()
    assert _cores_of(0) == everything


def test_a_host_takes_the_emptiest_core_and_stays_while_none_is_emptier(
        page: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Other hosts' cores steer the choice; ties part by slot; a placed host moves only for an emptier core."""
    monkeypatch.setattr(spinning, "_allowed", frozenset({0, 1}))
    assert spinning._choose({0: 1}, 0, 1) == (1, frozenset({1}))
    assert spinning._choose({0: 1, 1: 1}, 2, 1) == (0, frozenset({0}))
    assert spinning._choose({0: 1, 1: 1}, 3, 1) == (1, frozenset({1}))
    monkeypatch.setattr(spinning, "_core", 1)
    assert spinning._choose({0: 1, 1: 1}, 2, 1) == (1, frozenset({1}))
    assert spinning._choose({1: 2}, 2, 1) == (0, frozenset({0}))
    assert spinning._choose({7: 5, -3: 9}, 1, 1) == (1, frozenset({1}))  # cores not ours are ignored


def test_other_work_seen_now_and_then_neither_places_nor_unplaces_at_once(
        page: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ends are placed after CALM decisions more without other work than with it, and stay placed through a blip."""
    monkeypatch.setattr(spinning, "_allowed", frozenset({0, 1}))
    monkeypatch.setattr(spinning, "CALM", 3)
    spinning.enter()
    spinning.enter()
    try:
        busy = iter([1, 9, 1, 1, 1, 9, 1, 9, 9, 9])
        monkeypatch.setattr(spinning, "_running", lambda: next(busy))
        placed = []
        for _ in range(10):
            _fresh()
            placed.append(spinning.placement is not None)
        assert placed == [False, False, False, False, True, True, True, True, True, False]
    finally:
        spinning.leave()
        spinning.leave()
