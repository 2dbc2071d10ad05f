"""A forked child uses a SQLite run store through a connection of its own, and never hangs on its parent's."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

# Every test here starts a process (see tests/conftest.py): `make test` runs them, `make check` does not.
pytestmark = pytest.mark.process

_IDLE = textwrap.dedent("""\
    import json, os
    from proctor.store import RunRecord
    from proctor.store.sqlite import SQLiteRunStore

    store = SQLiteRunStore({path!r})
    store.create_run(RunRecord("run_parent", "before the fork"))
    pid = os.fork()
    who = "child" if pid == 0 else "parent"
    for i in range(150):  # both processes write at once, each through its own connection
        store.create_run(RunRecord(f"run_{{who}}_{{i}}", who))
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    runs = store.list_runs(limit=1000)
    print(json.dumps({{"runs": len(runs), "integrity": store._query("PRAGMA integrity_check")[0][0]}}))
    store.close()
""")

_MID_WRITE = textwrap.dedent("""\
    import json, os, threading
    from proctor.errors import StoreError
    from proctor.store import RunRecord
    from proctor.store.sqlite import SQLiteRunStore

    store = SQLiteRunStore({path!r})
    store.create_run(RunRecord("run_parent", "before the fork"))
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:  # a parent thread in the middle of a write transaction when the process forks
        with store._tx():
            store._db.execute("UPDATE runs SET status = status WHERE run_id = 'run_parent'")
            inside.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    inside.wait()
    pid = os.fork()
    if pid == 0:
        out = []
        for use in (lambda: store.get_run("run_parent"), lambda: store.create_run(RunRecord("run_child", "c"))):
            try:
                use()
                out.append("used")
            except StoreError as exc:
                out.append(str(exc))
        print(json.dumps({{"child": out}}), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    release.set()
    holder.join()
    store.create_run(RunRecord("run_after", "parent"))
    runs = sorted(r.run_id for r in store.list_runs())
    print(json.dumps({{"runs": runs, "integrity": store._query("PRAGMA integrity_check")[0][0]}}), flush=True)
    store.close()
""")


def _run(script: str, tmp_path: Path) -> list[dict[str, Any]]:
    proc = subprocess.run([sys.executable, "-c", script.format(path=str(tmp_path / "runs.db"))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_a_parent_and_its_forked_child_write_at_once_and_the_file_stays_whole(tmp_path: Path) -> None:
    """150 runs written by each side after a fork are all there, and SQLite's integrity check passes."""
    assert _run(_IDLE, tmp_path) == [{"runs": 301, "integrity": "ok"}]


def test_a_child_forked_during_a_parent_threads_write_is_refused_at_once_not_hung(tmp_path: Path) -> None:
    """Every use of the store in such a child raises a StoreError naming the fork; the parent goes on."""
    first, parent = _run(_MID_WRITE, tmp_path)
    child = first["child"]
    assert len(child) == 2 and all("forked while another thread wrote" in reason for reason in child)
    assert parent == {"runs": ["run_after", "run_parent"], "integrity": "ok"}
