"""A hostile program that reaches the hosts' shared page (process-only mode, `os` imported) cannot take a host down."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

# The host runs in a fresh interpreter (a SIGBUS would kill pytest itself), on a private page (never the real
# /dev/shm/proctor-hosts-<uid>, which other host processes on this machine use).
_HOST = textwrap.dedent("""\
    import sys
    from proctor.gate import Gate
    from proctor.interpreter import Interpreter, spinning
    from proctor.policy import Policy
    from proctor.testing import InMemoryAudit
    spinning._page_path = lambda: {page!r}
    gate = Gate(Policy.from_string("version: 1\\ndefault: allow\\n"), audit=InMemoryAudit())
    it = Interpreter([], gate, authorized_imports=["os"], sandbox="process", timeout=30)
    first = it.run({program!r})
    print("first", first.value, first.error, flush=True)
    for _ in range(3):
        it.run("sum(range(1000))")
    print("host alive", it.run("6 * 7").value, flush=True)
""")


def test_a_program_truncating_the_shared_page_does_not_kill_its_host(tmp_path: Path) -> None:
    """After the program truncates the page, the host process serves its next runs (no SIGBUS, no crash)."""
    page = tmp_path / "hosts"
    program = f"import os\nfd = os.open({str(page)!r}, os.O_RDWR)\nos.ftruncate(fd, 0)\n'done'"
    proc = subprocess.run([sys.executable, "-c", _HOST.format(page=str(page), program=program)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "first done None" in proc.stdout
    assert "host alive 42" in proc.stdout


def test_a_program_scribbling_on_the_shared_page_does_not_break_its_host(tmp_path: Path) -> None:
    """Garbage in every slot (huge, negative, future times and counts) leaves the host serving runs correctly."""
    page = tmp_path / "hosts"
    program = (f"import os\nfd = os.open({str(page)!r}, os.O_RDWR)\n"
               "os.pwrite(fd, b'\\xff' * 2048, 0)\n"
               "os.pwrite(fd, bytes(range(256)) * 8, 0)\n'done'")
    proc = subprocess.run([sys.executable, "-c", _HOST.format(page=str(page), program=program)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "first done None" in proc.stdout
    assert "host alive 42" in proc.stdout
