"""Small durable-file helpers: full writes, fsync that means it, atomic replace, secrets."""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
from pathlib import Path

from proctor.errors import ConfigurationError

__all__ = ["atomic_write", "read_or_create_secret", "sync_dir", "sync_fd", "write_all"]


def write_all(fd: int, data: bytes) -> None:
    """Write every byte (os.write may write less than asked, e.g. near a full disk)."""
    written = os.write(fd, data)
    if written == len(data):  # nearly always: one call
        return
    if written <= 0:  # pragma: no cover - os.write raises rather than returning 0 on regular files
        raise OSError(5, "short write")
    view = memoryview(data)[written:]
    while view:
        written = os.write(fd, view)
        if written <= 0:  # pragma: no cover - os.write raises rather than returning 0 on regular files
            raise OSError(5, "short write")
        view = view[written:]


def sync_fd(fd: int) -> None:
    """Push a file's data to stable storage. On macOS plain fsync stops at the drive cache."""
    if sys.platform == "darwin":  # pragma: no cover - exercised on macOS only
        import fcntl

        full = getattr(fcntl, "F_FULLFSYNC", None)
        if full is not None:
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, full)
                return
        os.fsync(fd)
        return
    # fdatasync also flushes the size change of an append, which is all a reader needs.
    os.fdatasync(fd)


def sync_dir(path: Path) -> None:
    """fsync a directory so a created or renamed entry in it survives a crash."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` all at once: temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        write_all(fd, data)
        sync_fd(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    sync_dir(path.parent)


def read_or_create_secret(path: Path, size: int = 32) -> bytes:
    """Read a secret file, or create it (mode 0600, random bytes) if it does not exist yet."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        data = path.read_bytes()
        if len(data) < 16:
            raise ConfigurationError(f"{path} holds {len(data)} bytes; a redaction key needs at least 16") from None
        return data
    data = secrets.token_bytes(size)
    try:
        write_all(fd, data)
        sync_fd(fd)
    finally:
        os.close(fd)
    sync_dir(path.parent)
    return data
