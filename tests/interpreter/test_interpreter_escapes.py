"""The escape corpus: hostile programs, each checked from the host — files, network, tools untouched."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import POLICY, REAL_RUNS, TOOLS, bwrap_status, bwrap_usable

from proctor.gate import Gate
from proctor.interpreter import ExecutionResult, Interpreter
from proctor.policy import Policy
from proctor.testing import InMemoryAudit

TOKEN = "s3cr3t-" + os.urandom(8).hex()
ENV_NAME = "PROCTOR_ESCAPE_TEST_SECRET"

CORPUS: dict[str, str] = {
    # dunder walks to subprocess.Popen and __subclasses__
    "subclasses_popen": "[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'Popen'][0]"
                        "(['touch', 'OUTDIR/pwned'])",
    "object_subclasses": "print(object.__subclasses__())",
    "type_subclasses": "print(type.__subclasses__(object))",
    "getattr_dunder": "print(getattr(object, '__subcl' + 'asses__')())",
    "vars_type_dict": "print(vars(type)['__subclasses__'](object))",
    "mro_walk": "print(int.mro()[-1].__subclasses__())",
    "bases_walk": "print(().__class__.__bases__[0].__subclasses__())",
    "format_walk": "print('{0.__class__.__base__.__subclasses__}'.format(1))",
    # frames
    "sys_getframe": "import sys\nprint(sys._getframe(0).f_back.f_globals)",
    "generator_gi_frame": "def g():\n    yield 1\nx = g()\nnext(x)\nprint(x.gi_frame.f_back.f_globals)",
    "traceback_tb_frame": "try:\n    1/0\nexcept Exception as e:\n    print(e.__traceback__.tb_frame.f_back.f_globals)",
    "stub_globals": "print(lookup.__globals__)\nlookup.__globals__['_proctor_call']('wipe', {'target': 'x'})",
    "code_object": "print(final_answer.__code__, lookup.__closure__)",
    # __builtins__ tricks
    "builtins_dict": "__builtins__['__import__']('os').system('touch OUTDIR/pwned')",
    "builtins_attr": "__builtins__.__import__('os').system('touch OUTDIR/pwned')",
    "globals_builtins": "globals()['__builtins__']['open']('OUTDIR/pwned', 'w')",
    "eval_exec_compile": "eval(\"__import__('os')\")\nexec('import os')\ncompile('1', 'x', 'exec')",
    "help_breakpoint": "breakpoint()\nhelp()",
    # imports
    "dunder_import": "__import__('os').system('touch OUTDIR/pwned')",
    "import_os": "import os\nos.system('touch OUTDIR/pwned')",
    "import_subprocess": "import subprocess\nsubprocess.run(['touch', 'OUTDIR/pwned'])",
    "ctypes_system": "import ctypes\nctypes.CDLL(None).system(b'touch OUTDIR/pwned')",
    "ctypes_unshare": "import ctypes\nprint(ctypes.CDLL(None).unshare(0x10000000))",
    "importlib": "import importlib\nimportlib.import_module('os').system('touch OUTDIR/pwned')",
    "private_module_attr": "import random\nrandom._os.system('touch OUTDIR/pwned')",
    "public_module_leak": "import statistics\nstatistics.sys.modules['os'].system('touch OUTDIR/pwned')",
    "from_import_leak": "from queue import threading\nprint(threading)",
    "gc_find_call": "import gc\nfns = [f for f in gc.get_objects() if type(f).__name__ == 'method'"
                    " and f.__name__ == 'call']\nprint(fns)\nfns[0]('wipe', {'target': 'x'})",
    "exec_shell": "import os\nos.execv('/bin/sh', ['sh', '-c', 'touch OUTDIR/pwned'])",
    # host files and environment
    "read_secret_open": "print(open('SECRET_PATH').read())",
    "read_secret_os": "import os\nprint(os.read(os.open('SECRET_PATH', os.O_RDONLY), 100))",
    "read_env": "import os\nprint(os.environ.get('ENV_NAME'), dict(os.environ))",
    "read_proc_environ": "print(open('/proc/HOST_PID/environ', 'rb').read())\n"
                         "print(open('/proc/1/environ', 'rb').read())",
    "read_home": "import os\nprint(os.listdir(os.path.expanduser('~')), os.listdir('/root'))",
    "symlink_secret": "import os\nos.symlink('SECRET_PATH', '/tmp/x')\nprint(open('/tmp/x').read())",
    # writing outside the tmpfs
    "write_canary": "open('CANARY', 'w').write('pwned')",
    "write_outdir": "open('OUTDIR/pwned', 'w').write('pwned')",
    "write_usr": "open('/usr/pwned', 'w').write('pwned')",
    # filling the sandbox's writable places (issue #11.8: /dev was an uncapped tmpfs in host memory)
    "fill_dev": "for i in range(100):\n    open('/dev/f%d' % i, 'w').write('x' * (1 << 26))",
    "fill_dev_shm": "for i in range(100):\n    open('/dev/shm/f%d' % i, 'w').write('x' * (1 << 26))",
    "fill_root": "for i in range(100):\n    open('/f%d' % i, 'w').write('x' * (1 << 26))",
    "fill_memfd": "import os\nfds = [os.memfd_create('f%d' % i) for i in range(100)]\n"
                  "for fd in fds:\n    os.write(fd, b'x' * (1 << 26))",
    # network
    "socket_localhost": "import socket\nsocket.create_connection(('127.0.0.1', PORT), timeout=0.5)",
    "urllib_localhost": "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:PORT/', timeout=0.5)",
    # resource bombs
    "fork_bomb": "import os\nwhile True:\n    os.fork()",
    "thread_bomb": "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(30,)).start()",
    "memory_bomb": "x = 'a' * (1 << 36)",
    "memory_growth": "chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 24))",
    "print_flood": "while True:\n    print('A' * 1000)",
    "deep_recursion": "def f(n):\n    return f(n + 1)\nf(0)",
    # a thread that calls a tool after the deadline
    "thread_after_deadline": "import threading, time\ndef later():\n    time.sleep(2.0)\n    lookup('late')\n"
                             "threading.Thread(target=later).start()\ntime.sleep(30)",
    # signal games
    "signal_ignore_term": "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                          "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])\ntime.sleep(30)",
    "signal_alarm": "import signal\nsignal.signal(signal.SIGALRM, lambda *a: None)\nsignal.alarm(1)\n"
                    "while True:\n    pass",
    # forged frames on the channel's file descriptors
    "forged_frames": "import os, json, struct\nfor run in range(40):\n"
                     "    b = json.dumps({'t': 'call', 'id': 10**6 + run, 'run': run, 'tool': 'wipe',"
                     " 'args': {'target': 'db'}}).encode()\n"
                     "    for fd in range(1024):\n        try:\n"
                     "            os.write(fd, struct.pack('>I', len(b)) + b)\n"
                     "        except OSError:\n            pass\nimport time\ntime.sleep(0.3)",
}
# Aimed at every process of the machine: run only inside the bubblewrap sandbox (pid namespace).
SANDBOX_ONLY: dict[str, str] = {
    "signal_kill_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
    "signal_kill_everyone": "import os\nos.kill(-1, 9)",
    "signal_kill_group": "import os, signal\nos.killpg(0, signal.SIGKILL)",
}
assert len(CORPUS) + len(SANDBOX_ONLY) >= 30


@dataclass
class Host:
    """What the programs aim at, on the host side."""

    secret: Path
    canary: Path
    outdir: Path
    port: int
    connections: list[Any]

    def files(self) -> dict[str, str]:
        return {p.name: p.read_text() for p in sorted(self.outdir.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    outdir = tmp_path_factory.mktemp("escape")
    secret, canary = outdir / "secret.txt", outdir / "canary.txt"
    secret.write_text(TOKEN)
    canary.write_text("untouched")
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    connections: list[Any] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, addr = server.accept()
            except OSError:
                continue
            connections.append(addr)
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    os.environ[ENV_NAME] = TOKEN
    try:
        yield Host(secret, canary, outdir, server.getsockname()[1], connections)
    finally:
        del os.environ[ENV_NAME]
        stop.set()
        thread.join()
        server.close()


MODES = [
    pytest.param(("bwrap", ()), id="bwrap-default",
                 marks=pytest.mark.skipif(not bwrap_usable(), reason=f"bubblewrap unusable: {bwrap_status()[1]}")),
    pytest.param(("process", ()), id="process-default"),
    pytest.param(("bwrap", ("*",)), id="bwrap-star",
                 marks=pytest.mark.skipif(not bwrap_usable(), reason=f"bubblewrap unusable: {bwrap_status()[1]}")),
]


@pytest.fixture(scope="module", params=MODES)
def setup(request: pytest.FixtureRequest, host: Host) -> Iterator[tuple[Interpreter, InMemoryAudit, str]]:
    sandbox, imports = request.param
    audit = InMemoryAudit()
    gate = Gate(Policy.from_dict(POLICY), audit=audit, tools=TOOLS)
    with Interpreter(TOOLS, gate, timeout=1.5, sandbox=sandbox, authorized_imports=imports) as py:
        yield py, audit, "star" if imports else "default"


def _ok_lookups(audit: InMemoryAudit) -> int:
    return sum(1 for o in audit.of_kind("call_outcome") if o["tool"] == "lookup" and o["status"] == "ok")


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_escape_attempt_leaves_the_host_untouched(setup: tuple[Interpreter, InMemoryAudit, str], host: Host,
                                                  name: str) -> None:
    """Files, network, environment and real tools of the host are untouched; every tool run passed the gate."""
    _attempt(*setup[:2], host, name, CORPUS[name])


@pytest.mark.parametrize("setup", [MODES[2]], indirect=True)
@pytest.mark.parametrize("name", sorted(SANDBOX_ONLY))
def test_signals_at_every_process_stay_in_the_sandbox(setup: tuple[Interpreter, InMemoryAudit, str], host: Host,
                                                      name: str) -> None:
    """kill(-1), killpg and killing the parent, with os authorized: only the sandbox dies; the host goes on."""
    _attempt(*setup[:2], host, name, SANDBOX_ONLY[name])


def _attempt(py: Interpreter, audit: InMemoryAudit, host: Host, name: str, code: str) -> None:
    for key, value in (("SECRET_PATH", str(host.secret)), ("CANARY", str(host.canary)),
                       ("OUTDIR", str(host.outdir)), ("PORT", str(host.port)), ("ENV_NAME", ENV_NAME),
                       ("HOST_PID", str(os.getpid()))):
        code = code.replace(key, value)
    files_before, lookups_before, ok_before = host.files(), REAL_RUNS["lookup"], _ok_lookups(audit)
    started = time.monotonic()
    result: ExecutionResult = py.run(code)
    assert time.monotonic() - started < py.timeout + 1.0  # preempted, never hung
    if name == "thread_after_deadline":
        time.sleep(1.0)  # the thread would call now, after the deadline
    leaked = f"{result.logs} {result.value!r} {result.error}"
    assert TOKEN not in leaked, f"{name} leaked the host secret"
    assert host.files() == files_before, f"{name} changed the host's files"
    assert host.connections == [], f"{name} reached the host's localhost"
    assert REAL_RUNS["wipe"] == 0, f"{name} ran a denied tool"
    assert REAL_RUNS["lookup"] - lookups_before == _ok_lookups(audit) - ok_before, "a tool ran without the gate"
    assert all(c.status != "ok" or c.tool == "lookup" for c in result.tool_calls)
    assert not [i for i in audit.of_kind("call_intent") if i["args"].get("order") == "late"], "called after deadline"
    assert py.run("6 * 7").value == 42  # and the interpreter still works (in a fresh worker if need be)
