"""A prelude for programs that play a hostile worker: find the channel and write raw frames on it."""

from __future__ import annotations

__all__ = ["PRELUDE"]

# The channel is the only socket among the worker's fds; `raw` writes bytes on it, `msg` one frame.
PRELUDE = """
import os, stat, struct, json
def _is_sock(f):
    try:
        return stat.S_ISSOCK(os.fstat(int(f)).st_mode)
    except OSError:
        return False
fd = [int(f) for f in os.listdir('/proc/self/fd') if _is_sock(f)][0]
def raw(b):
    os.write(fd, b)
def msg(m):
    b = json.dumps(m).encode()
    raw(struct.pack('>I', len(b)) + b)
"""
