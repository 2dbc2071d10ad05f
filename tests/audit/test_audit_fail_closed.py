"""Logs that cannot grow, or that grew by hand after they were closed: the audit trail fails closed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from audit_helpers import signing_key
from cryptography.hazmat.primitives import serialization

from proctor.audit import AuditLog, verify
from proctor.audit.records import seal

# RLIMIT_FSIZE makes the kernel refuse writes past the limit with EFBIG, part-way through a line if need
# be: the host sees a real short or failed write, whatever code path writes the log.
_HOST = textwrap.dedent("""\
    import json, resource, signal, sys, threading
    from proctor.audit import AuditLog
    from proctor.errors import ProctorError
    from proctor.gate import Gate
    from proctor.policy import Policy
    from proctor.tools import tool
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    log = AuditLog({path!r}, checkpoint_every=50)
    effects, outcomes, lock = [], [], threading.Lock()

    @tool(side_effect="write")
    def effect(token: str) -> str:
        '''Change the world.

        Args:
            token: What to write.
        '''
        with lock:
            effects.append(token)
        return "done"

    gate = Gate(Policy.from_string("version: 1\\ndefault: allow\\ntools:\\n  effect: {{side_effect: write}}\\n"),
                audit=log, tools=[effect])
    resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))

    def worker(t):
        ctx = gate.start_run(task="t")
        for i in range(400):
            out = gate.submit("effect", {{"token": f"t{{t}}c{{i}}"}}, context=ctx)
            with lock:
                outcomes.append(out.record.status)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    print(json.dumps({{"effects": effects, "outcomes": outcomes, "error": log.error}}))
""")


@pytest.mark.process
def test_a_log_that_cannot_grow_refuses_every_later_write_and_loses_no_intent(tmp_path: Path) -> None:
    """Past the size limit calls are refused, each write that ran has its intent, and the log recovers clean."""
    path = tmp_path / "audit.jsonl"
    proc = subprocess.run([sys.executable, "-c", _HOST.format(path=str(path), limit=48_000)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["error"], "the log never noticed it could not grow"
    ok = result["outcomes"].count("ok")
    assert 0 < ok < 1600 and ok == len(result["effects"])
    assert "ok" not in result["outcomes"][-800:]  # once the log failed it takes nothing more: every call refused
    AuditLog(path).close()  # reopened without the limit: a torn tail is cut, dangling intents closed
    report = verify(path)
    assert report.ok, report.failure
    intents = {json.dumps(r["args"], sort_keys=True)
               for r in map(json.loads, path.read_bytes().splitlines()) if r["kind"] == "call_intent"}
    missing = [e for e in result["effects"] if json.dumps({"token": e}, sort_keys=True) not in intents]
    assert missing == []


def test_a_complete_run_forged_after_a_signed_log_was_closed_fails_verify(tmp_path: Path) -> None:
    """A well-chained run appended by hand after the writer sealed and closed a signed log is not 'intact'."""
    key = signing_key()
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, signing_key=key, checkpoint_every=5) as log:
        for i in range(7):
            assert log.append("step", {"run_id": "run_1", "step": i}).ok
    lines = path.read_bytes().splitlines(keepends=True)
    last = json.loads(lines[-1])
    assert last["kind"] == "checkpoint"
    forged = []
    prev, seq = last["h"], last["seq"] + 1
    for kind, fields in [("run_started", {"run_id": "run_x"}),
                         ("call_intent", {"run_id": "run_x", "call_id": "c1", "tool": "wire", "args": {"to": "eve"}}),
                         ("call_outcome", {"run_id": "run_x", "call_id": "c1", "tool": "wire", "status": "ok"}),
                         ("run_finished", {"run_id": "run_x", "status": "done", "calls": {"ok": 1}})]:
        line, prev = seal({**fields, "kind": kind, "seq": seq, "ts_ns": last["ts_ns"] + seq, "prev": prev})
        forged.append(line)
        seq += 1
    path.write_bytes(b"".join(lines + forged))
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "key.pub").write_bytes(pub)
    report = verify(path, pubkey=str(tmp_path / "key.pub"))
    assert not report.ok
