"""Follow a log like ``tail -f``: print the last N records, then each new complete line.

A partial line (the writer is mid-append, or crashed) is held back until its newline
arrives; if the file shrinks (a reopening writer cut a torn last line) reading resumes
from the last complete line; if it is replaced, the new file is read from the start.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

__all__ = ["follow", "last_lines"]


def last_lines(f: os.PathLike[str] | str, n: int) -> tuple[list[bytes], int]:
    """The last `n` complete lines of a file and the offset just past the last complete line."""
    with open(f, "rb") as fh:
        end = fh.seek(0, os.SEEK_END)
        block, data, pos = 1 << 16, b"", end
        while pos > 0 and data.count(b"\n") <= n:
            pos = max(0, pos - block)
            fh.seek(pos)
            data = fh.read(end - pos)
    complete = data[: data.rfind(b"\n") + 1]
    lines = complete.split(b"\n")[:-1]
    if pos > 0:
        lines = lines[1:]  # the first piece may be the tail of an earlier line
    done = end - (len(data) - len(complete))
    return ([line for line in lines if line][-n:] if n else []), done


def follow(
    path: os.PathLike[str] | str,
    emit: Callable[[bytes], None],
    *,
    last: int = 10,
    keep_following: bool = False,
    poll_s: float = 0.1,
    stop: Callable[[], bool] | None = None,
) -> None:
    """Emit the last `last` lines, then (with `keep_following`) new lines until `stop()` or Ctrl-C."""
    lines, done = last_lines(path, last)
    for line in lines:
        emit(line)
    if not keep_following:
        return
    f = open(path, "rb")
    try:
        inode = os.fstat(f.fileno()).st_ino
        f.seek(done)
        buf = b""
        while stop is None or not stop():
            data = f.read()
            if data:
                if buf and os.pread(f.fileno(), len(buf), done) != buf:
                    # The partial line we hold was cut (and maybe overwritten) since we read it.
                    buf = b""
                    f.seek(done)
                    continue
                buf += data
                *complete, buf = buf.split(b"\n")
                for line in complete:
                    done += len(line) + 1
                    if line:
                        emit(line)
                continue
            try:
                st = os.stat(path)
            except FileNotFoundError:
                time.sleep(poll_s)
                continue
            if st.st_ino != inode:
                f.close()
                f = open(path, "rb")
                inode, done, buf = os.fstat(f.fileno()).st_ino, 0, b""
                continue
            if st.st_size < done + len(buf):
                buf = b""
                done = min(done, st.st_size)
                f.seek(done)
            time.sleep(poll_s)
    finally:
        f.close()
