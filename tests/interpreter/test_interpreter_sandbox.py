"""Tests for isolation choice, rlimits, the sandbox's view of the machine, and worker lifecycle."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from conftest import TOOLS, needs_bwrap

from proctor.errors import SandboxError
from proctor.gate import Gate
from proctor.interpreter import Interpreter, ProgramError
from proctor.interpreter import interpreter as interpreter_module
from proctor.interpreter import sandbox as sandbox_module
from proctor.testing import InMemoryAudit


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    def unusable() -> tuple[bool, str, bool]:
        return False, "bwrap is not installed", False

    monkeypatch.setattr(interpreter_module, "bwrap_status", unusable)
    monkeypatch.setattr(sandbox_module, "bwrap_status", unusable)


def test_sandbox_bwrap_refuses_to_start_without_it(no_bwrap: None, gate: Gate) -> None:
    """sandbox='bwrap' without bubblewrap is a SandboxError naming the fix."""
    with pytest.raises(SandboxError, match="apt-get install bubblewrap"):
        Interpreter(TOOLS, gate, sandbox="bwrap")


def test_auto_falls_back_loudly_and_records_the_isolation(no_bwrap: None, make: Callable[..., Interpreter],
                                                          audit: InMemoryAudit,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """Without bubblewrap, auto runs process-only, logs a warning, and the audit log says so."""
    import structlog

    structlog.reset_defaults()
    py = make(sandbox="auto")
    assert py.isolation == "process" and py.run("1 + 1").value == 2
    assert "PROCESS-ONLY ISOLATION" in caplog.text
    started = audit.of_kind("worker_started")
    assert started and started[-1]["isolation"] == "process" and started[-1]["sandbox"] == "auto"


@needs_bwrap
def test_auto_uses_bwrap_and_records_it(make: Callable[..., Interpreter], audit: InMemoryAudit) -> None:
    """With bubblewrap usable, auto picks it, and every worker start is in the audit log."""
    py = make(sandbox="auto")
    py.reset()
    py.run("1")
    started = audit.of_kind("worker_started")
    assert py.isolation == "bwrap" and [r["isolation"] for r in started] == ["bwrap", "bwrap"]


def test_invalid_sandbox_value_is_refused(gate: Gate) -> None:
    """An unknown sandbox mode is a ValueError, not a silent fallback."""
    with pytest.raises(ValueError, match="sandbox must be"):
        Interpreter(TOOLS, gate, sandbox="docker")  # type: ignore[arg-type]


@needs_bwrap
def test_rlimits_are_set_in_the_sandbox(make: Callable[..., Interpreter]) -> None:
    """Memory, CPU, processes, file size and core limits are in force before the program runs."""
    py = make(sandbox="bwrap", authorized_imports=["resource"], memory_limit=300 * 1024 * 1024, cpu_limit=77,
              max_processes=20)
    r = py.run("import resource as r\n[r.getrlimit(getattr(r, n))[0] for n in "
               "('RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_NPROC', 'RLIMIT_FSIZE', 'RLIMIT_CORE')]")
    assert r.error is None and r.value == [300 * 1024 * 1024, 77, 20, 64 * 1024 * 1024, 0]


def test_rlimits_are_set_in_process_mode(make: Callable[..., Interpreter]) -> None:
    """Process-only isolation sets the same limits."""
    py = make(sandbox="process", authorized_imports=["resource"], memory_limit=300 * 1024 * 1024, cpu_limit=77)
    r = py.run("import resource as r\n"
               "[r.getrlimit(getattr(r, n))[0] for n in ('RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_CORE')]")
    assert r.value == [300 * 1024 * 1024, 77, 0]


@needs_bwrap
def test_sandbox_view_is_minimal(make: Callable[..., Interpreter]) -> None:
    """No network but loopback, own pid namespace, private empty /tmp, scrubbed env, read-only system."""
    py = make(sandbox="bwrap", authorized_imports=["*"])
    code = ("import os, socket\n"
            "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
            "ifaces = [n for _, n in socket.if_nameindex()]\n"
            "(pids[:1], ifaces, os.listdir('/tmp'), os.getcwd(), sorted(os.environ), socket.gethostname(),"
            " os.access('/usr', os.W_OK))")
    r = py.run(code)
    assert r.error is None, r.error
    pids, ifaces, tmp, cwd, env, hostname, usr_writable = r.value
    assert pids == [1] and ifaces == ["lo"] and tmp == [] and cwd == "/tmp"
    assert set(env) <= {"PATH", "LANG", "HOME", "TMPDIR", "MALLOC_ARENA_MAX", "PWD"}
    assert hostname == "sandbox" and usr_writable is False


@needs_bwrap
def test_worker_has_no_child_processes(make: Callable[..., Interpreter]) -> None:
    """The seccomp filter refuses new processes (fork, vfork, posix_spawn) while threads still work."""
    py = make(sandbox="bwrap", authorized_imports=["*"])
    r = py.run("import os, subprocess, threading\nout = []\nt = threading.Thread(target=lambda: out.append(1))\n"
               "t.start()\nt.join()\ntry:\n    subprocess.run(['true'])\nexcept OSError as e:\n"
               "    out.append(e.errno)\ntry:\n    os.fork()\nexcept OSError as e:\n    out.append(e.errno)\nout")
    assert r.value == [1, 1, 1]


def test_memory_bomb_is_a_clean_error(py: Interpreter) -> None:
    """Allocating past the memory limit is a MemoryError in the program; the worker lives on."""
    py.run("kept = 5")
    r = py.run("x = bytearray(4 * 1024 ** 3)")
    assert isinstance(r.error, ProgramError) and r.error.type == "MemoryError"
    assert py.run("kept").value == 5


def test_worker_survives_the_thread_that_started_it(make: Callable[..., Interpreter]) -> None:
    """A worker started from a short-lived thread keeps running after that thread ends (die-with-parent)."""
    box: list[Interpreter] = []
    thread = threading.Thread(target=lambda: box.append(make()))
    thread.start()
    thread.join()
    time.sleep(0.2)
    assert box[0].run("40 + 2").value == 42


def test_close_kills_the_worker(make: Callable[..., Interpreter]) -> None:
    """close() leaves no worker process behind."""
    py = make()
    worker = py._worker
    assert worker is not None
    py.close()
    worker.proc.wait(timeout=5)
    assert worker.proc.returncode is not None


def test_worker_crash_is_a_sandbox_error_and_next_run_is_fresh(make: Callable[..., Interpreter]) -> None:
    """A worker that dies mid-run gives SandboxError with how it died; the next run gets a new worker."""
    py = make(sandbox="process", authorized_imports=["os"])
    py.run("a = 1")
    r = py.run("import os\nos.kill(os.getpid(), 9)")
    assert isinstance(r.error, SandboxError) and "killed by SIGKILL" in str(r.error) and r.state_lost
    again = py.run("'a' in dir()")
    assert again.value is False and again.state_lost


def test_seccomp_program_shape() -> None:
    """The filter is whole sock_filter instructions, checks the architecture first, and is absent elsewhere."""
    import struct

    from proctor.interpreter.sandbox import seccomp_program

    program = seccomp_program("x86_64")
    assert program is not None and len(program) % 8 == 0
    first = struct.unpack("=HBBI", program[:8])
    assert first == (0x20, 0, 0, 4)  # load seccomp_data.arch
    assert seccomp_program("sparc") is None
    aarch64 = seccomp_program("aarch64")
    assert aarch64 is not None and len(aarch64) % 8 == 0


def test_bwrap_missing_from_path_is_refused_with_the_fix(gate: Gate, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no bwrap on PATH, sandbox='bwrap' names the fix even after an earlier successful probe."""
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxError, match="apt-get install bubblewrap"):
        Interpreter(TOOLS, gate, sandbox="bwrap")
