"""A forked child of a process with an open PostgreSQL audit sink: refused at once, and the parent's session lives."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid

from fleet_engines import PostgresServer

from proctor.audit.postgres import verify_postgres

_PARENT = textwrap.dedent("""\
    import json, os, sys
    from proctor.audit.postgres import PostgresAuditLog
    log = PostgresAuditLog({url!r})
    assert log.append("call_intent", {{"call_id": "p0", "run_id": "r", "tool": "t"}}).ok
    pid = os.fork()
    if pid == 0:
        r = log.append("call_intent", {{"call_id": "c0", "run_id": "r", "tool": "t"}})
        print(json.dumps({{"child": r.ok, "error": r.error}}), flush=True)
        sys.exit(0)  # a normal exit: the child's atexit hooks run, and its objects are collected
    os.waitpid(pid, 0)
    oks = [log.append("call_intent", {{"call_id": f"p{{i}}", "run_id": "r", "tool": "t"}}).ok for i in range(1, 21)]
    log.close()
    print(json.dumps({{"parent": all(oks)}}), flush=True)
""")


def test_a_forked_child_is_refused_at_once_and_the_parent_keeps_appending(postgres_server: PostgresServer) -> None:
    """The child's append is refused without waiting, its exit does not end the parent's session, the chain verifies."""
    url = f"{postgres_server.url}&log={uuid.uuid4().hex[:12]}"
    proc = subprocess.run([sys.executable, "-c", _PARENT.format(url=url)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert {"child": False, "error": lines[0]["error"]} == lines[0] and "closed" in lines[0]["error"]
    assert lines[1] == {"parent": True}
    report = verify_postgres(url)
    assert report.ok, report.failure
    assert report.records == 22  # p0..p20 and the closing checkpoint: nothing of the child's
