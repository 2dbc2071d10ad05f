"""Follow a log like ``tail -f``: print the last N records, then each new complete line.

A partial line (the writer is mid-append, or crashed) is held back until its newline
arrives; if the file shrinks (a reopening writer cut a torn last line) reading resumes
from the last complete line; if it is replaced, the new file is read from the start.
A line over `MAX_LINE_BYTES` is never held whole: it is emitted as a `LongLine`.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from typing import BinaryIO

from proctor.audit.lines import MAX_LINE_BYTES, LongLine

__all__ = ["follow", "last_lines"]

_BLOCK = 1 << 16


def _line_at(fh: BinaryIO, start: int, end: int, limit: int) -> bytes | LongLine:
    if end - start > limit:
        return LongLine(start, end - start)
    fh.seek(start)
    return fh.read(end - start)


def last_lines(
    f: os.PathLike[str] | str, n: int, limit: int = MAX_LINE_BYTES,
) -> tuple[list[bytes | LongLine], int]:
    """The last `n` non-empty complete lines of a file and the offset just past the last complete
    line. Reads backwards in 64 KiB blocks keeping only newline positions, so memory stays
    bounded by `n` lines of at most `limit` bytes."""
    with open(f, "rb") as fh:
        end = fh.seek(0, os.SEEK_END)
        newlines: list[int] = []  # positions, last first
        pos = end
        while pos > 0 and len(newlines) <= n:
            start = max(0, pos - _BLOCK)
            fh.seek(start)
            block = fh.read(pos - start)
            at = len(block)
            while len(newlines) <= n:
                at = block.rfind(b"\n", 0, at)
                if at < 0:
                    break
                newlines.append(start + at)
            pos = start
        if not newlines:
            return [], 0
        done = newlines[0] + 1
        bounds = sorted(newlines)
        if len(bounds) <= n:  # the file's first line is among them
            bounds.insert(0, -1)
        lines = [_line_at(fh, a + 1, b, limit) for a, b in itertools.pairwise(bounds) if b > a + 1]
    return (lines[-n:] if n else []), done


def follow(
    path: os.PathLike[str] | str,
    emit: Callable[[bytes | LongLine], None],
    *,
    last: int = 10,
    keep_following: bool = False,
    poll_s: float = 0.1,
    stop: Callable[[], bool] | None = None,
    limit: int = MAX_LINE_BYTES,
) -> None:
    """Emit the last `last` lines, then (with `keep_following`) new lines until `stop()` or Ctrl-C."""
    lines, done = last_lines(path, last, limit)
    for line in lines:
        emit(line)
    if not keep_following:
        return
    f = open(path, "rb")
    try:
        inode = os.fstat(f.fileno()).st_ino
        f.seek(done)
        buf = b""
        skipping = -1  # the start of an over-long line being skipped, or -1
        while stop is None or not stop():
            data = f.read(_BLOCK * 16)
            if data:
                if buf and os.pread(f.fileno(), len(buf), done) != buf:
                    # The partial line we hold was cut (and maybe overwritten) since we read it.
                    buf, skipping = b"", -1
                    f.seek(done)
                    continue
                if skipping >= 0:
                    at = data.find(b"\n")
                    if at < 0:
                        continue
                    end = f.tell() - len(data) + at
                    emit(LongLine(skipping, end - skipping))
                    done, skipping = end + 1, -1
                    f.seek(done)
                    continue
                buf += data
                *complete, buf = buf.split(b"\n")
                for line in complete:
                    if len(line) > limit:
                        emit(LongLine(done, len(line)))
                    elif line:
                        emit(line)
                    done += len(line) + 1
                if len(buf) > limit:  # never hold more than the limit of one line
                    skipping, buf = done, b""
                continue
            try:
                st = os.stat(path)
            except FileNotFoundError:
                time.sleep(poll_s)
                continue
            if st.st_ino != inode:
                f.close()
                f = open(path, "rb")
                inode, done, buf, skipping = os.fstat(f.fileno()).st_ino, 0, b"", -1
                continue
            if st.st_size < done + len(buf):
                buf, skipping = b"", -1
                done = min(done, st.st_size)
                f.seek(done)
            time.sleep(poll_s)
    finally:
        f.close()
