"""Crash test: writers SIGKILLed at random points never leave an effect without its durable intent."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from proctor.audit import AuditLog, verify

# Every test here starts a process (see tests/conftest.py): `make test` runs them, `make check` does not.
pytestmark = pytest.mark.process

HARNESS = Path(__file__).with_name("crash_writer.py")
RUNS, LOGS = 120, 4


@pytest.mark.parametrize("threads", [1, 4])
def test_sigkilled_writers_never_run_a_tool_without_a_durable_intent(
    tmp_path: Path, threads: int,
) -> None:
    """After 120 random SIGKILLs, every effect has its intent, every intent one outcome, and each log verifies."""
    proc = subprocess.run(
        [sys.executable, str(HARNESS), str(tmp_path), str(RUNS), "20261129", str(LOGS), str(threads)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["problems"] == []
    assert summary["runs"] == RUNS
    assert summary["torn"] > 0  # some kills tore a line, so recovery was exercised
    total_effects = 0
    for n in range(LOGS):
        log_path, effects_path = tmp_path / f"log{n}.jsonl", tmp_path / f"effects{n}.txt"
        AuditLog(log_path).close()  # recovery of the last kill
        assert b'"kind":"recovery"' in log_path.read_bytes()
        report = verify(log_path)
        assert report.ok, report.failure
        assert report.dangling_intents == []
        records = [json.loads(line) for line in log_path.read_bytes().splitlines()]
        intents = Counter(r["call_id"] for r in records if r["kind"] == "call_intent")
        outcomes = {r["call_id"]: r["status"] for r in records if r["kind"] == "call_outcome"}
        assert max(intents.values(), default=1) == 1  # nothing was retried
        assert set(outcomes) == set(intents)
        assert set(outcomes.values()) <= {"ok", "unknown"}
        data = effects_path.read_bytes() if effects_path.exists() else b""
        assert data == b"" or data.endswith(b"\n")
        effects = data.decode().split()
        total_effects += len(effects)
        assert len(set(effects)) == len(effects)
        missing = [e for e in effects if e not in intents]
        assert missing == [], f"effects without an intent in {log_path}: {missing[:5]}"
        assert all(c in set(effects) for c, status in outcomes.items() if status == "ok")
        if threads > 1:
            _assert_each_effect_followed_an_fsync_of_its_intent(log_path, Path(str(effects_path) + ".events"))
    assert total_effects > RUNS // 4  # the writers did real work between kills (fewer on a loaded machine)


def _assert_each_effect_followed_an_fsync_of_its_intent(log_path: Path, events_path: Path) -> None:
    # Group commit: an append returns once *an* fsync covering its line has completed, maybe
    # another thread's. The events file orders completed fsyncs (bytes covered) and effects.
    # Runs append to one log after recovery, so offsets are those of the final file for lines
    # that survived (a recovery only cuts a torn tail, which holds no intent an effect followed).
    end_of: dict[str, int] = {}
    offset = 0
    for line in log_path.read_bytes().splitlines(keepends=True):
        offset += len(line)
        record = json.loads(line)
        if record["kind"] == "call_intent":
            end_of[record["call_id"]] = offset
    synced = 0
    shared = 0
    for event in events_path.read_text().splitlines():
        kind, value = event.split(" ", 1)
        if kind == "S":
            synced = max(synced, int(value))
            continue
        assert end_of[value] <= synced, f"{value} ran before an fsync covered its intent"
        shared += 1
    assert shared > 0
