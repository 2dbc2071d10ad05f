"""Crash test through the Gate: SIGKILLed runs never leave a side effect whose intent was not on disk first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from proctor.audit import AuditLog, verify

# Every test here starts a process (see tests/conftest.py): `make test` runs them, `make check` does not.
pytestmark = pytest.mark.process

HARNESS = Path(__file__).with_name("gate_crash_writer.py")
RUNS, THREADS = 30, 4


def test_sigkilled_gate_runs_never_ran_a_write_before_its_intent_was_fsynced(
    tmp_path: Path,
) -> None:
    """After 30 random SIGKILLs of 4 threads calling a write tool, each effect followed an fsync of its intent."""
    proc = subprocess.run([sys.executable, str(HARNESS), str(tmp_path), str(RUNS), "20261130", str(THREADS)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["problems"] == []
    log_path = tmp_path / "audit.jsonl"
    AuditLog(log_path).close()  # recovery of the last kill
    report = verify(log_path)
    assert report.ok, report.failure
    assert report.dangling_intents == []
    end_of: dict[str, int] = {}
    offset = 0
    records = []
    for line in log_path.read_bytes().splitlines(keepends=True):
        offset += len(line)
        record = json.loads(line)
        records.append(record)
        if record["kind"] == "call_intent" and record.get("tool") == "effect":
            end_of[json.dumps(record["args"], sort_keys=True)] = offset
    synced, effects = 0, 0
    for event in (tmp_path / "events.txt").read_text().splitlines():
        kind, value = event.split(" ", 1)
        if kind == "S":
            synced = max(synced, int(value))
            continue
        key = json.dumps({"token": value}, sort_keys=True)
        assert key in end_of, f"effect {value} has no intent in the log"
        assert end_of[key] <= synced, f"effect {value} ran before an fsync covered its intent"
        effects += 1
    assert effects > RUNS  # the threads did real work between kills
    outcomes = {r["call_id"] for r in records if r["kind"] == "call_outcome"}
    assert all(r["call_id"] in outcomes for r in records if r["kind"] == "call_intent")
