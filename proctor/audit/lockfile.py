"""One writer per log across processes: an exclusive, non-blocking `flock` on ``<log>.lock``.

The lock file is never deleted: unlinking it would let a second writer lock a new
inode while the first still holds the old one. The holder writes its pid into it so
a refused writer can say who holds the log. The kernel drops the lock when the
holder's descriptor closes, including when the process dies.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from proctor.errors import AuditError

__all__ = ["acquire", "release"]


def acquire(lock_path: Path, log_path: Path) -> int:
    """Lock `lock_path` for writing `log_path`; return the descriptor, or raise `AuditError` if taken."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise AuditError(f"cannot create the lock file {lock_path}: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise AuditError(f"{log_path} is locked by another writer (pid {holder})") from None
        raise AuditError(f"cannot lock {lock_path}: {exc.strerror or exc}") from exc
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    return fd


def release(fd: int) -> None:
    """Unlock and close a descriptor returned by `acquire`."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
