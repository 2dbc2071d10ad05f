"""Reopening a log: torn tails cut into recovery records, dangling intents closed as unknown, other damage refused."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from audit_helpers import offset_of, rec, reseal

from proctor.audit import AuditLog, verify
from proctor.errors import AuditCorrupted


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def _log(path: Path, n: int = 3, *, close: bool = True) -> None:
    log = AuditLog(path, durability="flush")
    for i in range(n):
        assert log.append("step", {"step": i}).ok
    if close:
        log.close()
    else:  # a crash: drop the descriptor (and with it the writer lock) without sealing
        import os

        os.close(log._fd)


@pytest.mark.parametrize("tail", [b'{"h":"12', b"garbage", b"\x00" * 300, b'{"half": tr'])
def test_torn_or_unreadable_last_line_is_cut_and_recorded(tmp_path: Path, tail: bytes) -> None:
    """The cut bytes' count, sha256 and (small) content go into a recovery record; the log verifies."""
    path = tmp_path / "a.jsonl"
    _log(path, close=False)
    before = path.read_bytes()
    path.write_bytes(before + tail)
    with AuditLog(path) as log:
        assert log.seq == 4
    recovery = _records(path)[3]
    assert recovery["kind"] == "recovery"
    cut = recovery["cut"]
    assert (cut["bytes"], cut["offset"], cut["line"]) == (len(tail), len(before), 4)
    assert cut["sha256"] == hashlib.sha256(tail).hexdigest()
    assert base64.b64decode(cut["b64"]) == tail
    assert verify(path).ok


@pytest.mark.parametrize("damage", ["garbage", "blank", "hash", "reseal_ok_json_bad_prev"])
@pytest.mark.parametrize("side_file", [True, False])
def test_complete_bad_last_line_is_tampering_not_a_crash(tmp_path: Path, damage: str, side_file: bool) -> None:
    """A newline-terminated last line that does not parse or chain raises AuditCorrupted; nothing is cut."""
    path = tmp_path / "a.jsonl"
    _log(path, n=4)
    lines = path.read_bytes().splitlines(keepends=True)
    last = lines[-1]
    if damage == "garbage":
        lines.append(b"garbage\n")
    elif damage == "blank":
        lines.append(b"\n")
    elif damage == "hash":
        lines[-1] = last.replace(b'"kind":"checkpoint"', b'"kind":"checkpoinT"')
    else:
        lines.append(json.dumps({"kind": "step", "seq": 5, "prev": "00" * 32, "h": "11" * 32}).encode() + b"\n")
    if not side_file:
        (tmp_path / "a.jsonl.checkpoint").unlink()
    data = b"".join(lines)
    path.write_bytes(data)
    with pytest.raises(AuditCorrupted, match="proctor audit verify"):
        AuditLog(path)
    assert path.read_bytes() == data
    assert not verify(path).ok


def test_large_torn_tail_keeps_its_digest_but_not_its_bytes(tmp_path: Path) -> None:
    """A cut over 4 KiB is recorded by size and sha256 only."""
    path = tmp_path / "a.jsonl"
    _log(path, close=False)
    tail = b'{"big":"' + b"x" * 5000
    path.write_bytes(path.read_bytes() + tail)
    AuditLog(path).close()
    cut = _records(path)[3]["cut"]
    assert cut["bytes"] == len(tail) and "b64" not in cut
    assert cut["sha256"] == hashlib.sha256(tail).hexdigest()


def test_dangling_intents_get_unknown_outcomes_and_are_never_retried(tmp_path: Path) -> None:
    """Each intent without an outcome is closed by a call_outcome with status unknown, in intent order."""
    path = tmp_path / "a.jsonl"
    log = AuditLog(path)
    log.append("call_intent", {"call_id": "c1", "run_id": "r", "tool": "pay"})
    log.append("call_intent", {"call_id": "c2", "run_id": "r", "tool": "mail"})
    log.append("call_outcome", {"call_id": "c2", "status": "ok"})
    log.append("call_intent", {"call_id": "c3", "run_id": "r", "tool": "mail"})
    log.close()
    report = verify(path)
    assert report.dangling_intents == ["c1", "c3"] and any("dangling" in w for w in report.warnings)
    AuditLog(path).close()
    recs = _records(path)
    recovery = next(r for r in recs if r["kind"] == "recovery")
    assert recovery["unknown_calls"] == ["c1", "c3"] and recovery["cut"] is None
    unknown = [r for r in recs if r.get("status") == "unknown"]
    assert [(r["call_id"], r["tool"], r["intent_seq"]) for r in unknown] == [("c1", "pay", 0), ("c3", "mail", 3)]
    assert [r["kind"] for r in recs].count("call_intent") == 3  # nothing re-attempted
    after = verify(path)
    assert after.ok and after.dangling_intents == []
    AuditLog(path).close()
    assert len(_records(path)) == len(recs)  # nothing more to recover the second time


@pytest.mark.parametrize("damage", ["hash", "torn_middle", "seq_gap", "blank_middle"])
def test_damage_before_the_last_line_refuses_to_append(tmp_path: Path, damage: str) -> None:
    """Anything but a torn last line raises AuditCorrupted saying where, and leaves the file untouched."""
    path = tmp_path / "a.jsonl"
    _log(path, n=5)
    lines = path.read_bytes().splitlines(keepends=True)
    i = 2
    if damage == "hash":
        lines[i] = lines[i].replace(b'"step":2', b'"step":7')
    elif damage == "torn_middle":
        lines[i] = lines[i][:20] + b"\n"
    elif damage == "seq_gap":
        del lines[i]
    else:
        lines.insert(i, b"\n")
    data = b"".join(lines)
    path.write_bytes(data)
    with pytest.raises(AuditCorrupted) as caught:
        AuditLog(path)
    err = caught.value
    assert (err.seq, err.line, err.offset) == (i, i + 1, offset_of(lines, i))
    assert f"line {i + 1}" in str(err) and "not appending" in str(err)
    assert path.read_bytes() == data
    with pytest.raises(AuditCorrupted):  # the lock was released: the same error again, not "locked"
        AuditLog(path)


def test_log_shorter_than_its_side_file_is_refused(tmp_path: Path) -> None:
    """Records cut at a line boundary behind the side file's checkpoint are a rollback, not a crash."""
    path = tmp_path / "a.jsonl"
    _log(path, n=4)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:2]))
    with pytest.raises(AuditCorrupted, match="shorter than its checkpoint side file") as caught:
        AuditLog(path)
    assert caught.value.seq == 2


def test_torn_checkpoint_named_by_the_side_file_is_refused(tmp_path: Path) -> None:
    """A crash cannot tear a checkpoint the side file already holds, so that is refused too."""
    path = tmp_path / "a.jsonl"
    _log(path, n=2)
    data = path.read_bytes()
    path.write_bytes(data[:-40])
    with pytest.raises(AuditCorrupted, match="side file"):
        AuditLog(path)
    assert path.read_bytes() == data[:-40]  # the evidence is left as it was found


def test_damaged_side_file_is_refused(tmp_path: Path) -> None:
    """A side file that does not hash is reported as damage of the side file."""
    path = tmp_path / "a.jsonl"
    _log(path, n=2)
    side = Path(str(path) + ".checkpoint")
    side.write_bytes(reseal(dict(rec(side.read_bytes()), size=1))[:-1].replace(b'"size":1', b'"size":2') + b"\n")
    with pytest.raises(AuditCorrupted, match="side file"):
        AuditLog(path)
