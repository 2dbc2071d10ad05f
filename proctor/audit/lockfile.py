"""One writer per log: an exclusive, non-blocking `flock` on the open log file itself.

The lock belongs to the file, not to the name it was opened by: a symlink, a hard
link, a ``..`` path or a relative path to the same log all reach the same inode, so a
second writer is refused whatever path it used, in this process (flock locks belong
to an open file description, and each `AuditLog` opens its own) or in another. The
kernel drops the lock when the holder's descriptor closes, including when the process
dies. A refused writer names the holder's pid when ``/proc/locks`` shows it (Linux).
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from proctor.errors import AuditError

__all__ = ["holder_pid", "lock_log", "unlock_log"]


def lock_log(fd: int, log_path: Path) -> None:
    """Lock the open log `fd` for writing; raise `AuditError` naming the holder if another writer has it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            holder = holder_pid(fd)
            raise AuditError(f"{log_path} is locked by another writer (pid {holder or 'unknown'}); "
                             "close that AuditLog first or write to another file") from None
        raise AuditError(f"cannot lock {log_path}: {exc.strerror or exc}") from exc


def unlock_log(fd: int) -> None:
    """Unlock and close a descriptor locked by `lock_log`."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def holder_pid(fd: int) -> int | None:
    """The pid holding an exclusive flock on the file behind `fd`, from ``/proc/locks``; None if unknown."""
    st = os.fstat(fd)
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    by_inode: int | None = None
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            for line in f:
                # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:6178277 0 EOF" ("->" marks waiters)
                parts = line.split()
                if "->" in parts or len(parts) < 6 or parts[1] != "FLOCK" or parts[3] != "WRITE":
                    continue
                if not parts[4].isdigit():
                    continue
                if parts[5] == device:
                    return int(parts[4])
                if by_inode is None and parts[5].rsplit(":", 1)[-1] == str(st.st_ino):
                    by_inode = int(parts[4])  # some filesystems show another device number
    except OSError:
        return None
    return by_inode
