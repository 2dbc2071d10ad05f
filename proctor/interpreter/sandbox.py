"""How the worker process is started: bubblewrap when it works, a plain process otherwise.

Under bubblewrap the worker gets every namespace of its own (no network, own pid, ipc,
uts, user and cgroup namespaces), a read-only view of the Python installation and of
this package only, a private size-limited tmpfs as /tmp (its cwd), no host home, an
environment built from nothing, ``--die-with-parent``, and a seccomp filter that
refuses creating processes (threads still work) and a few kernel interfaces a
program has no use for. rlimits (memory, CPU, processes, file size, no core) are set
in every mode, by the worker on itself before any program runs.
"""

from __future__ import annotations

import marshal
import os
import platform
import queue
import shutil
import struct
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from proctor.errors import SandboxError

__all__ = ["SandboxSpec", "bwrap_status", "build_command", "describe_isolation", "describe_sandbox",
           "require_bwrap", "seccomp_program", "spawn", "worker_env"]

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # .../proctor
# The worker's code arrives as marshalled code objects on stdin (host -> worker, the trusted
# direction): no package directory is mounted into the sandbox, and nothing is compiled at start-up
# even where PYTHONDONTWRITEBYTECODE left no bytecode cache.
WORKER_MODULES = ("proctor.errors", "proctor.interpreter.channel", "proctor.interpreter.guard",
                  "proctor.interpreter.worker_io", "proctor.interpreter.program", "proctor.interpreter.worker")
BOOTSTRAP = (
    "import sys,marshal,types\n"
    "for n in ('proctor','proctor.interpreter'):\n"
    "    m=types.ModuleType(n);m.__path__=[];sys.modules[n]=m\n"
    "for n,f,c in marshal.loads(sys.stdin.buffer.read()):\n"
    "    m=types.ModuleType(n);m.__file__=f;sys.modules[n]=m\n"
    "    p,_,a=n.rpartition('.');setattr(sys.modules[p],a,m);exec(c,m.__dict__)\n"
    "sys.stdin.close()\n"
    "sys.modules['proctor.interpreter.worker'].main(int(sys.argv[1]),int(sys.argv[2]))\n"
)
INSTALL_HINT = "install bubblewrap (apt-get install bubblewrap) or pass sandbox='process'"


@dataclass(frozen=True)
class SandboxSpec:
    """Everything that decides how one worker is started."""

    isolation: str  # "bwrap" | "process"
    tmpfs_bytes: int = 64 * 1024 * 1024  # /tmp
    shm_bytes: int = 16 * 1024 * 1024  # /dev/shm
    extra_paths: tuple[str, ...] = ()  # read-only binds for authorized third-party packages
    env: dict[str, str] = field(default_factory=dict)


def worker_env() -> dict[str, str]:
    """The whole environment the worker gets: nothing inherited from the host."""
    # MALLOC_ARENA_MAX: glibc reserves 64 MiB of address space per thread arena, which would make
    # RLIMIT_AS stop a program at a dozen threads.
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "TMPDIR": "/tmp",
            "MALLOC_ARENA_MAX": "2"}


def python_executable() -> str:
    """The real interpreter binary (a venv's `python` is a symlink to it)."""
    return os.path.realpath(sys.executable)


def site_paths() -> list[str]:
    """Where this interpreter imports third-party packages from, for authorized imports beyond the
    standard library: its real ``sys.path`` (site-packages, ``.pth`` and ``PYTHONPATH`` entries, wherever
    they live, a virtualenv under /tmp included), bound read-only into the sandbox.

    Left out: the working directory and the main script's directory (the user's project, with whatever
    secrets it holds, is not the program's to read), and ``/`` or the home directory as a whole.
    """
    paths = sysconfig.get_paths()
    private = {os.path.realpath(p) for p in (os.getcwd(), "/", os.path.expanduser("~"))}
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if main:
        private.add(os.path.realpath(os.path.dirname(main)))
    out = []
    for entry in [*sys.path, paths.get("purelib"), paths.get("platlib")]:
        if not entry or not os.path.isabs(entry) or not os.path.exists(entry):
            continue
        real = os.path.realpath(entry)
        if real not in private and real not in out:
            out.append(real)
    return out


# -- seccomp: no new processes, no kernel attack surface a program has no use for -----------------

_ARCH: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, dict(clone=56, fork=57, vfork=58, clone3=435, ptrace=101, mount=165, umount2=166,
                               memfd_create=319, memfd_secret=447, shmget=29,
                               unshare=272, setns=308, keyctl=250, add_key=248, request_key=249, bpf=321,
                               perf_event_open=298, userfaultfd=323, io_uring_setup=425, io_uring_enter=426,
                               io_uring_register=427, chroot=161, pivot_root=155, process_vm_readv=310,
                               process_vm_writev=311, kexec_load=246, init_module=175, finit_module=313)),
    "aarch64": (0xC00000B7, dict(clone=220, clone3=435, ptrace=117, mount=40, umount2=39, unshare=97, setns=268,
                                memfd_create=279, memfd_secret=447, shmget=194,
                                keyctl=219, add_key=217, request_key=218, bpf=280, perf_event_open=241,
                                userfaultfd=282, io_uring_setup=425, io_uring_enter=426, io_uring_register=427,
                                chroot=51, pivot_root=41, process_vm_readv=270, process_vm_writev=271,
                                kexec_load=104, init_module=105, finit_module=273)),
}


def seccomp_program(machine: str | None = None) -> bytes | None:
    """A classic-BPF seccomp filter for this machine, or None on an architecture we do not know."""
    machine = machine or platform.machine()
    if machine not in _ARCH:
        return None
    arch, nr = _ARCH[machine]
    eperm, enosys = 0x00050000 | 1, 0x00050000 | 38
    allow, kill = 0x7FFF0000, 0x80000000
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    prog: list[tuple[int, int, int, int]] = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if machine == "x86_64":
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, kill)]  # x32 syscalls
    for name in sorted(nr):
        if name in ("clone", "clone3"):
            continue
        prog += [(jeq, 0, 1, nr[name]), (ret, 0, 0, eperm)]
    prog += [(jeq, 0, 1, nr["clone3"]), (ret, 0, 0, enosys)]  # glibc falls back to clone()
    prog += [(jeq, 0, 3, nr["clone"]), (ld, 0, 0, 16), (jset, 1, 0, 0x00010000), (ret, 0, 0, eperm),
             (ret, 0, 0, allow)]
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


# -- bubblewrap ------------------------------------------------------------------------------------

def build_command(spec: SandboxSpec, chan_fds: tuple[int, int], seccomp_fd: int | None, *,
                  disable_userns: bool = True, argv: Sequence[str] | None = None) -> list[str]:
    """The full argv starting the worker (bwrap-wrapped or plain); `chan_fds` are the worker's ends of the
    channel: the pipe it reads the host's messages from, and the one it writes its own to."""
    chan = [str(chan_fds[0]), str(chan_fds[1])]
    python = python_executable()
    if argv is not None:
        worker = list(argv)
    elif "PYTHONHASHSEED" in spec.env:
        # -I would ignore PYTHONHASHSEED (a durable run's fixed hash seed). The environment is built
        # from nothing anyway (worker_env), so keep the rest of -I: no user site, no '' on sys.path.
        worker = [python, "-s", "-S", "-B", "-c", "import sys;sys.path=[p for p in sys.path if p]\n" + BOOTSTRAP,
                  *chan]
    else:
        worker = [python, "-I", "-S", "-B", "-c", BOOTSTRAP, *chan]
    if spec.isolation != "bwrap":
        return worker
    bwrap = shutil.which("bwrap") or "bwrap"
    cmd = [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
           "--hostname", "sandbox"]
    if disable_userns:
        cmd.append("--disable-userns")
    binds: list[str] = ["/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            binds.append(top)
    prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
    prefixes.add(str(Path(python).parent.parent))
    binds += [*sorted(prefixes), *spec.extra_paths]
    # The private /tmp first: a read-only bind under /tmp (a virtualenv there) is mounted inside it, not hidden.
    cmd += ["--size", str(spec.tmpfs_bytes), "--tmpfs", "/tmp"]
    for path in _outermost(binds):
        cmd += ["--ro-bind", path, path]
    # Every writable place is a size-capped tmpfs: /tmp (above), and /dev/shm; bwrap's own /dev and the
    # sandbox's root are tmpfs without a size, so both are made read-only once everything is mounted.
    cmd += ["--proc", "/proc", "--dev", "/dev", "--size", str(spec.shm_bytes), "--perms", "1777", "--tmpfs",
            "/dev/shm", "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
    for key, value in (spec.env or worker_env()).items():
        cmd += ["--setenv", key, value]
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    return [*cmd, "--", *worker]


def _outermost(paths: list[str]) -> list[str]:
    """Drop paths already inside another bound path; keep order stable."""
    real = sorted({os.path.realpath(p) for p in paths if os.path.exists(p)}, key=len)
    kept: list[str] = []
    for p in real:
        if not any(p == k or p.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(p)
    return kept


_probe_lock = threading.Lock()
_probe: dict[str, Any] = {}


def bwrap_status() -> tuple[bool, str, bool]:
    """(usable, reason, supports --disable-userns), probed once per process by starting a real sandbox."""
    if shutil.which("bwrap") is None:  # checked every time: cheap, and PATH may change
        return False, "bwrap is not installed", False
    with _probe_lock:
        if "ok" not in _probe:
            _probe.update(zip(("ok", "reason", "disable_userns"), _run_probe(), strict=True))
        return _probe["ok"], _probe["reason"], _probe["disable_userns"]


def describe_isolation(isolation: str, requested: str = "auto") -> str:
    """How a worker of `isolation` is held, in the words run summaries print after ``sandbox:``.

    ``bubblewrap``, or ``process only (why)``: bubblewrap not installed (with the command that installs
    it), installed but unusable here (bubblewrap's own reason), or a plain process asked for.
    """
    if isolation == "bwrap":
        return "bubblewrap"
    if requested in ("process", "none"):
        return f"process only (sandbox={requested!r} was asked for)"
    ok, reason, _ = bwrap_status()
    if shutil.which("bwrap") is None:
        return "process only (bubblewrap not installed: apt-get install bubblewrap)"
    return f"process only ({reason})" if not ok else "process only"


def describe_sandbox(requested: str = "auto") -> str:
    """`describe_isolation` of the worker an Interpreter given ``sandbox=requested`` would start now."""
    if requested in ("process", "none"):
        return describe_isolation("process", requested)
    if bwrap_status()[0]:
        return "bubblewrap"
    if requested == "bwrap":
        return f"none: sandbox='bwrap' but {bwrap_status()[1]} (no program can start)"
    return describe_isolation("process", requested)


def require_bwrap(requested: str = "auto") -> None:
    """Raise `SandboxError` (one line, naming the fix) unless a worker asked for with `requested` would run
    under bubblewrap: what a policy's ``sandbox: required`` holds an Interpreter or an agent to."""
    if requested in ("process", "none"):
        raise SandboxError(f"the policy says `sandbox: required` (bubblewrap), but sandbox={requested!r} was asked "
                           "for: leave sandbox='auto' or 'bwrap'")
    ok, reason, _ = bwrap_status()
    if not ok:
        fix = "apt-get install bubblewrap" if shutil.which("bwrap") is None else "see docs/sandbox.md"
        raise SandboxError(f"the policy says `sandbox: required`, but {reason}: {fix}")


def _run_probe() -> tuple[bool, str, bool]:
    if not sys.platform.startswith("linux"):
        return False, "bubblewrap needs Linux", False
    if shutil.which("bwrap") is None:
        return False, "bwrap is not installed", False
    spec = SandboxSpec("bwrap")
    argv = [python_executable(), "-I", "-S", "-c", "pass"]
    last = ""
    for disable in (True, False):
        seccomp = _seccomp_fd()
        try:
            done = run_in_spawner(lambda d=disable, fd=seccomp: subprocess.run(  # type: ignore[misc]
                build_command(spec, (0, 0), fd, disable_userns=d, argv=argv), capture_output=True, timeout=20,
                stdin=subprocess.DEVNULL, env=worker_env(), pass_fds=() if fd is None else (fd,)))
        except (OSError, subprocess.SubprocessError) as exc:
            return False, f"bwrap could not run: {exc}", False
        finally:
            if seccomp is not None:
                os.close(seccomp)
        if done.returncode == 0:
            return True, "bwrap works", disable
        lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
        last = lines[-1] if lines else f"exit {done.returncode}"
    return False, f"bwrap is installed but cannot create a sandbox here: {last}", False


def _seccomp_fd() -> int | None:
    """A readable fd holding this machine's seccomp program (bwrap --seccomp), or None."""
    program = seccomp_program()
    if program is None:
        return None
    read_end, write_end = os.pipe()
    os.write(write_end, program)
    os.close(write_end)
    return read_end


_payload: list[bytes] = []


def worker_payload() -> bytes:
    """The worker's modules, compiled once per host process and marshalled."""
    if not _payload:
        items = []
        for name in WORKER_MODULES:
            path = PACKAGE_DIR.joinpath(*name.split(".")[1:]).with_suffix(".py")
            items.append((name, str(path), compile(path.read_bytes(), str(path), "exec", dont_inherit=True)))
        _payload.append(marshal.dumps(items))
    return _payload[0]


# -- spawning --------------------------------------------------------------------------------------

T = TypeVar("T")
_jobs: queue.SimpleQueue[tuple[Callable[[], Any], queue.SimpleQueue[tuple[bool, Any]]]] = queue.SimpleQueue()
_spawner: threading.Thread | None = None
_spawner_lock = threading.Lock()


def _serve() -> None:
    while True:
        job, box = _jobs.get()
        try:
            box.put((True, job()))
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller's thread
            box.put((False, exc))


def run_in_spawner(job: Callable[[], T]) -> T:
    """Run `job` on one long-lived thread.

    bwrap's --die-with-parent uses PR_SET_PDEATHSIG, which fires when the *thread* that
    forked bwrap exits; forking from a thread that lives as long as the process keeps a
    worker started from, say, ``asyncio.to_thread`` alive for as long as its host.
    """
    global _spawner
    with _spawner_lock:
        if _spawner is None or not _spawner.is_alive():
            _spawner = threading.Thread(target=_serve, name="proctor-spawner", daemon=True)
            _spawner.start()
    box: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
    _jobs.put((job, box))
    ok, value = box.get()
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def spawn(spec: SandboxSpec, chan_fds: tuple[int, int], log_fd: int, diag_fd: int,
          cwd: str | None) -> subprocess.Popen[bytes]:
    """Start a worker whose channel is `chan_fds` (it reads the first, writes the second), stdout `log_fd`,
    stderr `diag_fd`."""
    seccomp_r = None
    pass_fds = list(chan_fds)
    disable_userns = True
    if spec.isolation == "bwrap":
        ok, reason, disable_userns = bwrap_status()
        if not ok:
            raise SandboxError(f"sandbox='bwrap' but {reason}: {INSTALL_HINT}")
        seccomp_r = _seccomp_fd()
        if seccomp_r is not None:
            pass_fds.append(seccomp_r)
    cmd = build_command(spec, chan_fds, seccomp_r, disable_userns=disable_userns)
    payload = worker_payload()
    try:
        proc = run_in_spawner(lambda: subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=log_fd, stderr=diag_fd, pass_fds=pass_fds, close_fds=True,
            env=spec.env or worker_env(), cwd=cwd, start_new_session=True))
    except OSError as exc:
        hint = f": {INSTALL_HINT}" if spec.isolation == "bwrap" else ""
        raise SandboxError(f"could not start the worker ({cmd[0]}): {exc}{hint}") from None
    finally:
        if seccomp_r is not None:
            os.close(seccomp_r)
    assert proc.stdin is not None
    try:
        proc.stdin.write(payload)  # blocks only until the worker reads it, right as it starts
    except OSError:
        pass  # the worker died at once; the host sees its channel close and reports how it ended
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass
    return proc
