"""A forked child cannot write its parent's audit log: its calls are refused, and the parent's log stays whole."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from proctor.audit import verify

# Every test here starts a process (see tests/conftest.py): `make test` runs them, `make check` does not.
pytestmark = pytest.mark.process

_PARENT = textwrap.dedent("""\
    import json, os, sys, threading
    from proctor.audit import AuditLog
    from proctor.errors import AuditError
    from proctor.gate import Gate
    from proctor.policy import Policy
    from proctor.tools import tool

    @tool(side_effect="write")
    def effect(n: int) -> int:
        '''Change the world.

        Args:
            n: Which change.
        '''
        with open({marks!r}, "a") as f:
            f.write(f"{{os.getpid()}} {{n}}\\n")
        return n

    log = AuditLog({path!r})
    gate = Gate(Policy.from_string("version: 1\\ndefault: allow\\ntools:\\n  effect: {{side_effect: write}}\\n"),
                audit=log, tools=[effect])
    ctx = gate.start_run()
    gate.call("effect", {{"n": 1}}, context=ctx)
    busy = threading.Thread(target=lambda: [gate.submit("effect", {{"n": 9}}, context=ctx) for _ in range(50)])
    busy.start()  # another thread appending while the process forks
    pid = os.fork()
    if pid == 0:
        out = gate.submit("effect", {{"n": 2}}, context=ctx)
        print(json.dumps({{"child": out.record.status, "error": out.record.error}}), flush=True)
        sys.exit(0)  # a normal exit: the child's atexit hooks run
    busy.join()
    os.waitpid(pid, 0)
    try:
        AuditLog({path!r})
        second = "opened"
    except AuditError:
        second = "refused"
    out = gate.submit("effect", {{"n": 3}}, context=ctx)
    log.close()
    print(json.dumps({{"parent": out.record.status, "second_writer": second}}), flush=True)
""")


def test_a_forked_child_is_refused_and_the_parents_log_still_verifies(tmp_path: Path) -> None:
    """The child's write call is refused (tool not run), its exit leaves the lock held, and the log verifies."""
    path, marks = tmp_path / "audit.jsonl", tmp_path / "marks"
    proc = subprocess.run([sys.executable, "-c", _PARENT.format(path=str(path), marks=str(marks))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    child = next(line for line in lines if "child" in line)
    parent = next(line for line in lines if "parent" in line)
    assert child["child"] == "denied" and "closed" in child["error"]
    assert parent == {"parent": "ok", "second_writer": "refused"}
    ran = [line.split()[1] for line in marks.read_text().splitlines()]
    assert "2" not in ran and ran.count("1") == 1 and ran.count("3") == 1
    report = verify(path)
    assert report.ok, report.failure
