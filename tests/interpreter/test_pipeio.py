"""proctor._pipeio, the host's reads and writes of its channel ends, gives what os.read and os.write give."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from proctor.interpreter import host


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    yield r, w
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass


def test_it_built_and_the_host_uses_it() -> None:
    from proctor import _pipeio

    assert (host._read_now, host._write_now) == (_pipeio.read, _pipeio.write), (
        "proctor._pipeio did not build: install a C compiler and the Python headers (python3-dev), then "
        "`pip install -e '.[dev]'`")


@pytest.mark.parametrize("impl", ["native", "os"])
def test_reads_and_writes_like_os(pipe: tuple[int, int], impl: str) -> None:
    from proctor import _pipeio

    read, write = (_pipeio.read, _pipeio.write) if impl == "native" else (os.read, os.write)
    r, w = pipe
    with pytest.raises(BlockingIOError):  # an empty pipe: at once, never a wait
        read(r, 100)
    assert write(w, memoryview(b"..frame")[2:]) == 5
    assert read(r, 3) == b"fra"
    assert read(r, 1 << 16) == b"me"
    sent = 0
    with pytest.raises(BlockingIOError):  # a full pipe: a partial write, then EAGAIN, never a wait
        while True:
            sent += write(w, b"x" * 100_000)
    assert sent >= 4096
    got = 0
    while got < sent:
        got += len(read(r, 1 << 16))
    assert got == sent
    os.close(w)
    assert read(r, 10) == b""  # the other end closed: end of file
    with pytest.raises(OSError, match="Invalid argument"):
        read(r, -1)


def test_a_closed_reader_is_a_broken_pipe(pipe: tuple[int, int]) -> None:
    from proctor import _pipeio

    r, w = pipe
    os.close(r)
    previous = signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as in any Python process
    try:
        with pytest.raises(BrokenPipeError):
            _pipeio.write(w, b"x")
    finally:
        signal.signal(signal.SIGPIPE, previous)
    with pytest.raises(OSError):
        _pipeio.read(-1, 10)
