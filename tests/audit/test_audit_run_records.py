"""`AuditLog.run_records`: one run's records, read from the run's start when the (untrusted) hint is right, and from
the whole file when it is not — never fewer records than the whole file holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from proctor.audit import AuditLog


def _run(log: AuditLog, run_id: str, calls: int) -> int:
    started = log.append("run_started", {"run_id": run_id, "principal": "alice"})
    assert started.ok and started.seq is not None
    for i in range(calls):
        assert log.append("call_intent", {"run_id": run_id, "call_id": f"{run_id}-{i}", "tool": "t",
                                          "args": {"quoted": '"run_id":"run_me"'}}).ok
        assert log.append("call_outcome", {"run_id": run_id, "call_id": f"{run_id}-{i}", "tool": "t",
                                           "status": "ok"}, durable=False).ok
    return started.seq


def _every(path: Path, run_id: str) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in records if r.get("run_id") == run_id]


def test_a_right_start_reads_from_the_runs_start_and_finds_every_record(tmp_path: Path) -> None:
    """Other runs before, interleaved with and after the run (some quoting its id in their arguments): with the
    seq of its run_started, the run's records are exactly the whole file's, and a record of the run put in the
    log before its start (which the gate never writes) is not read: the reader did begin at the start."""
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, checkpoint_every=50) as log:
        for n in range(30):  # enough records before it for the search to halve the file a few times
            _run(log, f"run_before{n}", 20)
        assert log.append("policy_changed", {"run_id": "run_me", "sha256": "x"}).ok  # before its start
        start = _run(log, "run_me", 5)
        _run(log, "run_after", 5)
        assert log.append("run_finished", {"run_id": "run_me", "status": "done"}).ok
        whole = log.run_records("run_me")
        hinted = log.run_records_from("run_me", start)
    assert whole == _every(path, "run_me") and len(whole) == 1 + 1 + 10 + 1
    assert hinted == whole[1:]


def test_a_wrong_start_is_a_whole_file_read(tmp_path: Path) -> None:
    """Another run's start, a record that is not a start, a seq past the end or before the first: each is checked
    and not believed, and the run's records are the whole file's (the earlier one included)."""
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, checkpoint_every=50) as log:
        other = _run(log, "run_other", 40)
        assert log.append("policy_changed", {"run_id": "run_me", "sha256": "x"}).ok
        start = _run(log, "run_me", 40)
        _run(log, "run_after", 40)
        whole = log.run_records("run_me")
        for wrong in (other, start + 1, start + 2, log.seq + 10, -1, 0):
            assert log.run_records_from("run_me", wrong) == whole, wrong
    assert whole == _every(path, "run_me") and whole[0]["kind"] == "policy_changed"


def test_an_empty_log_or_a_run_it_never_saw_has_no_records(tmp_path: Path) -> None:
    with AuditLog(tmp_path / "audit.jsonl") as log:
        assert log.run_records_from("run_x", 0) == []
        _run(log, "run_a", 2)
        assert log.run_records("run_x") == [] and log.run_records_from("run_x", 0) == []
