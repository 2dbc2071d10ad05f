"""A worker that writes its own frames and stops reading cannot hold its host past the run's deadline."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hostile_frames import PRELUDE

from proctor.errors import ProctorError
from proctor.interpreter import Interpreter

_FLOOD = """
import itertools, time
for i in itertools.count(10**6):
    msg({'t': 'call', 'id': i, 'run': RUN, 'tool': 'lookup', 'args': {'order': 'x' * 2000}})
"""


def test_a_worker_flooding_calls_without_reading_replies_ends_at_its_deadline(
        make: Callable[..., Interpreter]) -> None:
    """Forged calls written without reading a reply fill the channel: the run still ends by its 2 s deadline."""
    interp = make(sandbox="process", authorized_imports=["os", "stat", "struct", "json", "time", "itertools"],
                  timeout=2)
    r = interp.run(PRELUDE + _FLOOD.replace("RUN", str(interp._seq + 1)))
    assert isinstance(r.error, ProctorError)
    assert r.duration < 3.5, r.duration  # 2 s, and generous room for a loaded machine; it was 10 s
    assert interp.run("6 * 7").value == 42


@pytest.mark.parametrize("body", [
    "raw(struct.pack('>I', 100) + b'{\"t\":')",  # a frame cut short, then silence
    "raw(b'\\x00\\x00')",  # half a length header
    "raw(struct.pack('>I', 4000))\nfor _ in range(400):\n    raw(b' ')\n    time.sleep(0.02)",  # a byte at a time
])
def test_a_frame_left_unfinished_ends_the_run_at_its_deadline(make: Callable[..., Interpreter], body: str) -> None:
    """A partial frame, half a header or a frame trickled in bytes: the run ends at its 2 s deadline, host fine."""
    interp = make(sandbox="process", authorized_imports=["os", "stat", "struct", "json", "time"], timeout=2)
    r = interp.run("import time\n" + PRELUDE + body + "\ntime.sleep(30)")
    assert isinstance(r.error, ProctorError)
    assert r.duration < 3.5, r.duration
    assert interp.run("6 * 7").value == 42


_PIPES = """
import fcntl
def _is_pipe(f):
    try:
        return int(f) > 2 and stat.S_ISFIFO(os.fstat(int(f)).st_mode)
    except OSError:  # the directory listing's own fd, closed by now
        return False
mine = [int(f) for f in os.listdir('/proc/self/fd') if _is_pipe(f)]
"""


def test_a_worker_that_shrinks_its_channel_pipes_is_still_served(make: Callable[..., Interpreter]) -> None:
    """Both channel pipes cut to one page by the program: large arguments and results still cross, whole."""
    interp = make(sandbox="process", authorized_imports=["os", "stat", "struct", "json", "fcntl"], timeout=20)
    r = interp.run(PRELUDE + _PIPES + "for f in mine:\n    fcntl.fcntl(f, fcntl.F_SETPIPE_SZ, 4096)\n"
                   "sizes = [fcntl.fcntl(f, fcntl.F_GETPIPE_SZ) for f in mine]\n"
                   "got = [lookup('x' * 200_000) for _ in range(3)]\n(sizes, [len(g) for g in got])")
    assert r.error is None, r.error
    sizes, lengths = r.value
    assert sizes and set(sizes) == {4096}
    assert lengths == [len("order : shipped") + 200_000] * 3
    assert interp.run("6 * 7").value == 42


def test_a_worker_that_closes_its_channel_pipes_loses_the_run_not_the_host(make: Callable[..., Interpreter]) -> None:
    """The program closes the pipe it reads the host's messages from, then calls: the run is lost, the next works."""
    interp = make(sandbox="process", authorized_imports=["os", "stat", "struct", "json", "fcntl"], timeout=5)
    r = interp.run(PRELUDE + _PIPES + "for f in mine:\n    if f != fd:\n        os.close(f)\nlookup('A-1')")
    assert isinstance(r.error, ProctorError)
    assert r.state_lost
    assert interp.run("6 * 7").value == 42
