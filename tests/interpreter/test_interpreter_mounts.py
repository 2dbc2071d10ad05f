"""Writable places under bubblewrap: each is a size-capped tmpfs, and a program writing past the cap is stopped."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import needs_bwrap

from proctor.interpreter import Interpreter

pytestmark = needs_bwrap

MiB = 1024 * 1024
# Mount types that hold no data a program can grow: process info, terminals, device nodes bound from the host.
NOT_STORAGE = {"proc", "devpts", "sysfs", "devtmpfs", "mqueue"}

LIST_WRITABLE = """
out = []
for line in open('/proc/self/mountinfo').read().splitlines():
    left, right = line.split(' - ')
    fields, (fstype, source, options) = left.split(), right.split()[:3]
    if fields[5].split(',')[0] == 'rw' and fstype not in NOT_STORAGE:
        size = [o.split('=')[1] for o in options.split(',') if o.startswith('size=')]
        out.append((fields[4], fstype, size[0] if size else None))
sorted(out)
"""

FILL = """
written = 0
chunk = 'x' * (4 * 1024 * 1024)
error = None
try:
    for i in range(64):  # up to 64 files of 8 MiB (each under the 64 MiB file-size limit)
        with open('PLACE/fill' + str(i), 'w') as fh:
            for _ in range(2):
                fh.write(chunk)
                fh.flush()
                written += len(chunk)
except OSError as e:
    error = type(e).__name__ + ': ' + str(e)
(written, error)
"""


def test_every_writable_mount_is_a_capped_tmpfs(make: Callable[..., Interpreter]) -> None:
    """Inside the sandbox only /tmp (64 MiB) and /dev/shm (16 MiB) are writable storage, both tmpfs with a size."""
    py = make(sandbox="bwrap")
    r = py.run(f"NOT_STORAGE = {sorted(NOT_STORAGE)!r}\n" + LIST_WRITABLE)
    assert r.error is None, r.error
    assert [tuple(m) for m in r.value] == [("/dev/shm", "tmpfs", "16384k"), ("/tmp", "tmpfs", "65536k")]


@pytest.mark.parametrize("place, cap", [("/tmp", 64 * MiB), ("/dev/shm", 16 * MiB)])
def test_writing_past_each_cap_fails(make: Callable[..., Interpreter], place: str, cap: int) -> None:
    """Files written to a writable mount stop at its cap with ENOSPC, whatever the number of files."""
    py = make(sandbox="bwrap", timeout=30)
    r = py.run(FILL.replace("PLACE", place))
    assert r.error is None, r.error
    written, error = r.value
    assert error is not None and "No space left on device" in error
    assert written <= cap


@pytest.mark.parametrize("place", ["/", "/dev", "/usr", "/proc/self"])
def test_the_rest_is_read_only(make: Callable[..., Interpreter], place: str) -> None:
    """The sandbox's root, bwrap's /dev, the system directories: no file can be created there."""
    py = make(sandbox="bwrap")
    r = py.run(f"try:\n    open('{place}/pwned', 'w').write('x')\nexcept OSError as e:\n    err = type(e).__name__\n"
               "else:\n    err = None\nerr")
    assert r.value in ("OSError", "PermissionError", "FileNotFoundError"), r.value


def test_memory_outside_the_mounts_is_refused(make: Callable[..., Interpreter]) -> None:
    """With every import allowed: memfd_create and SysV shared memory fail (EPERM), /dev stays read-only."""
    py = make(sandbox="bwrap", authorized_imports=["*"])
    r = py.run("import os, ctypes, errno\nout = {}\ntry:\n    os.memfd_create('x')\nexcept OSError as e:\n"
               "    out['memfd'] = e.errno\nlibc = ctypes.CDLL(None, use_errno=True)\n"
               "out['shmget'] = (libc.shmget(0, 64 * 1024 * 1024, 0o1000 | 0o600), ctypes.get_errno())\n"
               "try:\n    open('/dev/big', 'wb').write(b'x')\nexcept OSError as e:\n    out['dev'] = e.errno\nout")
    assert r.error is None, r.error
    import errno

    assert r.value == {"memfd": errno.EPERM, "shmget": (-1, errno.EPERM), "dev": errno.EROFS}
