"""Attacks on the run boundary: forged `done`s, threads left running, calls from an earlier program."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest
from conftest import ISOLATIONS, REAL_RUNS, needs_bwrap

from proctor.errors import SandboxError
from proctor.interpreter import Interpreter
from proctor.testing import InMemoryAudit

STAR = [pytest.param("bwrap", marks=needs_bwrap), "process"]

# With "*" the program finds the worker's own channel object in its heap and reports its run as done.
FORGE_DONE = """
import gc, time
ch = [o for o in gc.get_objects() if type(o).__name__ == 'Channel'][0]
ch.send({'t': 'done', 'run': RUN, 'value': 'all good', 'error': None, 'final': True, 'cut': False, 'key': KEY})
t = time.monotonic()
while time.monotonic() - t < 30:
    pass
"""


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes, all threads, from /proc."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _worker_pids(py: Interpreter) -> list[int]:
    from proctor.interpreter.host import _children

    assert py._worker is not None
    todo, out = [py._worker.proc.pid], []
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += _children(pid)
    return out


@pytest.mark.parametrize("sandbox", STAR)
@pytest.mark.parametrize("key", ["None", "'0' * 32", "'guess'"])
def test_done_forged_from_the_heap_is_a_protocol_violation(make: Callable[..., Interpreter], audit: InMemoryAudit,
                                                           sandbox: str, key: str) -> None:
    """A program that sends its own run's `done` (without the run's key) ends as a protocol violation, at once."""
    py = make(sandbox=sandbox, authorized_imports=["*"], timeout=20)
    py.run("kept = 1")
    started = time.monotonic()
    r = py.run(FORGE_DONE.replace("RUN", str(py._seq + 1)).replace("KEY", key))
    assert time.monotonic() - started < 10
    assert isinstance(r.error, SandboxError) and "protocol violation" in str(r.error), r.error
    assert r.value != "all good" and r.state_lost
    assert [v["reason"] for v in audit.of_kind("protocol_violation")] == [
        "done message without the run's key (written by the program, not the worker)"]
    assert py.run("'kept' in dir()").value is False


@pytest.mark.parametrize("sandbox", STAR)
def test_done_forged_with_the_stolen_key_freezes_the_program(make: Callable[..., Interpreter], audit: InMemoryAudit,
                                                             sandbox: str) -> None:
    """With the key lifted from the worker's frames, the program still stops at its forged done until the next run."""
    py = make(sandbox=sandbox, authorized_imports=["*"], timeout=5)
    steal = ("import sys, operator\nloc, back = operator.attrgetter('f_locals'), operator.attrgetter('f_back')\n"
             "f = sys._getframe()\nwhile f is not None and 'key' not in loc(f):\n    f = back(f)\n"
             "KEY_ = loc(f)['key']\n")
    code = steal + FORGE_DONE.replace("RUN", str(py._seq + 1)).replace("KEY", "KEY_")
    r = py.run(code)
    assert r.value == "all good"  # the program chose its own result; with "*" it can compute anything
    pids = _worker_pids(py)
    assert py._worker is not None and py._worker.frozen
    cpu = _cpu_seconds(pids)
    time.sleep(1.0)
    assert _cpu_seconds(pids) - cpu < 0.1  # the spinning program is stopped between runs
    later = py.run("1")  # resumed under this run's deadline: its main thread never reads the next run
    assert later.error is not None and later.state_lost
    assert later.duration < py.timeout + 2


@pytest.mark.parametrize("sandbox", ISOLATIONS)
def test_leftover_threads_use_no_cpu_between_runs(make: Callable[..., Interpreter], sandbox: str) -> None:
    """A daemon thread spinning after its program ended burns nothing until the next run starts."""
    py = make(sandbox=sandbox, authorized_imports=["threading"])
    r = py.run("import threading\nspins = [0]\ndef spin():\n    while True:\n        spins[0] += 1\n"
               "threading.Thread(target=spin, daemon=True).start()\nimport time\ntime.sleep(0.2)\nspins[0] > 0")
    assert r.value is True
    pids = _worker_pids(py)
    cpu = _cpu_seconds(pids)
    time.sleep(1.0)
    assert _cpu_seconds(pids) - cpu < 0.1
    assert py.run("spins[0] > 0").value is True  # the state is kept: frozen, not replaced


@pytest.mark.parametrize("sandbox", ISOLATIONS)
def test_a_leftover_thread_cannot_call_tools_in_a_later_run(make: Callable[..., Interpreter], audit: InMemoryAudit,
                                                            sandbox: str) -> None:
    """A thread of run 1 whose call comes due during run 2 is refused in the worker and never reaches the gate."""
    py = make(sandbox=sandbox, authorized_imports=["threading", "time"])
    before = REAL_RUNS["lookup"]
    r1 = py.run("import threading, time\nseen = []\ndef later():\n    time.sleep(0.5)\n    try:\n"
                "        seen.append(lookup('late'))\n    except Exception as e:\n"
                "        seen.append(type(e).__name__ + ': ' + str(e))\n"
                "threading.Thread(target=later, daemon=True).start()\n'started'")
    assert r1.value == "started"
    r2 = py.run("time.sleep(1.5)\nseen")
    assert r2.error is None and not r2.state_lost, r2.error
    assert len(r2.value) == 1 and r2.value[0].startswith("ToolDenied: lookup: refused, this thread was started by "
                                                          "an earlier program")
    assert r2.tool_calls == ()
    assert REAL_RUNS["lookup"] == before
    assert not [i for i in audit.of_kind("call_intent") if i["args"].get("order") == "late"]
    assert py.run("lookup('now')").error is None  # the program's own main thread still calls tools


@pytest.mark.parametrize("sandbox", ISOLATIONS)
def test_a_leftover_thread_cannot_answer_for_a_later_run(make: Callable[..., Interpreter], sandbox: str) -> None:
    """final_answer() from a thread of an earlier program does not end the running one."""
    py = make(sandbox=sandbox, authorized_imports=["threading", "time"])
    py.run("import threading, time\ndef later():\n    time.sleep(0.5)\n    final_answer('from the past')\n"
           "threading.Thread(target=later, daemon=True).start()")
    r = py.run("time.sleep(1.5)\n'present'")
    assert r.error is None and r.value == "present" and not r.is_final_answer


@pytest.mark.parametrize("sandbox", ISOLATIONS)
def test_threads_started_in_the_run_call_tools_normally(make: Callable[..., Interpreter], sandbox: str) -> None:
    """Threads the running program started are its own: their calls are served, in any run they start in."""
    py = make(sandbox=sandbox, authorized_imports=["threading"])
    code = ("import threading\nout = []\nts = [threading.Thread(target=lambda i=i: out.append(lookup(str(i))))"
            " for i in range(4)]\nfor t in ts:\n    t.start()\nfor t in ts:\n    t.join()\nsorted(out)")
    for _ in range(2):
        r = py.run(code)
        assert r.error is None and len(r.value) == 4 and len(r.tool_calls) == 4
