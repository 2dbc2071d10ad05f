"""A cleanly closed log says so under its signature; records appended after it without reopening fail verify."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from audit_helpers import lines_of, other_key, rec, resign, signing_key, write_log
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from proctor.audit import AuditLog, verify
from proctor.audit.keys import key_id, public_raw
from proctor.audit.merkle import merkle_root
from proctor.audit.records import seal
from proctor.errors import AuditCorrupted, AuditError


def _forged(last: dict[str, Any], kinds: list[tuple[str, dict[str, Any]]]) -> list[bytes]:
    """Records chained after `last` as anyone who can write the file can chain them (the chain has no key)."""
    out, prev, seq = [], last["h"], last["seq"] + 1
    for kind, fields in kinds:
        line, prev = seal({**fields, "kind": kind, "seq": seq, "ts_ns": last["ts_ns"] + seq, "prev": prev})
        out.append(line)
        seq += 1
    return out


def _forged_checkpoint(lines: list[bytes], key: Ed25519PrivateKey, **flags: bool) -> bytes:
    """A checkpoint over `lines`, signed by `key`, as the log's own would be."""
    last = rec(lines[-1])
    body = {"kind": "checkpoint", "seq": last["seq"] + 1, "ts_ns": last["ts_ns"] + 1, "prev": last["h"],
            "log": last["log"], "size": len(lines), "head": last["h"],
            "root": merkle_root([bytes.fromhex(rec(x)["h"]) for x in lines]).hex(),
            "key_id": key_id(key), "pub": public_raw(key.public_key()).hex(), **flags}
    line, _ = seal(resign(body, key))
    return line


def test_close_marks_its_checkpoint_and_a_writer_reopens_before_appending(tmp_path: Path) -> None:
    """close() seals with a closed checkpoint; appending again starts with a reopened one, and the log verifies."""
    path = tmp_path / "a.jsonl"
    write_log(path, 2)
    with AuditLog(path, signing_key=signing_key()) as log:
        assert log.append("step", {"run_id": "r2", "step": 0}).ok
    kinds = [(r["kind"], r.get("closed"), r.get("reopened")) for r in map(rec, lines_of(path.read_bytes()))]
    assert kinds[-4:] == [("checkpoint", True, None), ("checkpoint", None, True), ("step", None, None),
                          ("checkpoint", True, None)]
    report = verify(path, pubkey=signing_key().public_key())
    assert report.ok and report.warnings == []


def test_a_record_appended_after_close_fails_verify_with_after_close(tmp_path: Path) -> None:
    """One forged record after the closing checkpoint is AFTER_CLOSE at its seq and line, in one process or many."""
    path = tmp_path / "a.jsonl"
    write_log(path, 4)
    lines = lines_of(path.read_bytes())
    path.write_bytes(b"".join(lines + _forged(rec(lines[-1]), [("step", {"run_id": "r9", "step": 0})])))
    for workers in (1, 2):
        report = verify(path, pubkey=signing_key().public_key(), workers=workers)
        assert report.failure is not None
        assert (report.failure.code, report.failure.seq, report.failure.line) == (
            "AFTER_CLOSE", len(lines), len(lines) + 1)
        assert "without a checkpoint saying a writer reopened it" in report.failure.message


def test_a_reopening_checkpoint_signed_by_another_key_fails_verify(tmp_path: Path) -> None:
    """A forger who signs the reopening checkpoint with a key of their own is caught without --pubkey too."""
    path = tmp_path / "a.jsonl"
    write_log(path, 3)
    lines = lines_of(path.read_bytes())
    reopen = _forged_checkpoint(lines, other_key(), reopened=True)
    run = [("run_started", {"run_id": "rx"}), ("run_finished", {"run_id": "rx", "status": "done"})]
    rest = _forged(rec(reopen), run)
    path.write_bytes(b"".join([*lines, reopen, *rest]))
    report = verify(path)
    assert report.failure is not None and report.failure.code == "AFTER_CLOSE"
    assert "reopened by one signed by" in report.failure.message


def test_a_checkpoint_after_close_that_does_not_say_reopened_fails_verify(tmp_path: Path) -> None:
    """Only a checkpoint marked reopened may follow a closing one, even when the log's own key signed it."""
    path = tmp_path / "a.jsonl"
    write_log(path, 3)
    lines = lines_of(path.read_bytes())
    path.write_bytes(b"".join([*lines, _forged_checkpoint(lines, signing_key())]))
    report = verify(path, pubkey=signing_key().public_key())
    assert report.failure is not None and report.failure.code == "AFTER_CLOSE"


def test_an_unsigned_closed_log_is_checked_the_same_way(tmp_path: Path) -> None:
    """Without a key the mark proves less (a forger can write an unsigned reopening), but a bare append still fails."""
    path = tmp_path / "a.jsonl"
    with AuditLog(path, durability="flush") as log:
        assert log.append("step", {"step": 0}).ok
    lines = lines_of(path.read_bytes())
    path.write_bytes(b"".join(lines + _forged(rec(lines[-1]), [("step", {"step": 1})])))
    report = verify(path)
    assert report.failure is not None and report.failure.code == "AFTER_CLOSE"


def test_a_writer_refuses_a_log_with_records_appended_after_close(tmp_path: Path) -> None:
    """Reopening such a log for appending raises AuditCorrupted: it is tampering, not a crash to recover from."""
    path = tmp_path / "a.jsonl"
    write_log(path, 2)
    lines = lines_of(path.read_bytes())
    path.write_bytes(b"".join(lines + _forged(rec(lines[-1]), [("step", {"step": 9})])))
    with pytest.raises(AuditCorrupted, match="appended after it was closed"):
        AuditLog(path, signing_key=signing_key())


@pytest.mark.parametrize("key", [None, "other"])
def test_appending_to_a_signed_closed_log_needs_its_key(tmp_path: Path, key: str | None) -> None:
    """Opening a signed, closed log without its signing key refuses in one line that names --audit-key."""
    path = tmp_path / "a.jsonl"
    write_log(path, 2)
    before = path.read_bytes()
    with pytest.raises(AuditError, match=r"append to it with that signing key \(--audit-key\)"):
        AuditLog(path, signing_key=other_key() if key else None)
    assert path.read_bytes() == before


def test_opening_and_closing_a_closed_log_without_appending_writes_nothing(tmp_path: Path) -> None:
    """A writer that appends nothing leaves the closed log byte for byte as it was."""
    path = tmp_path / "a.jsonl"
    write_log(path, 2)
    before = path.read_bytes()
    AuditLog(path, signing_key=signing_key()).close()
    assert path.read_bytes() == before


def test_a_closed_flag_that_is_not_a_bool_is_a_parse_failure_signed_or_not(tmp_path: Path) -> None:
    """`"closed": "yes"` on an unsigned checkpoint is refused like on a signed one, not read as false."""
    path = tmp_path / "a.jsonl"
    with AuditLog(path, durability="flush") as log:
        assert log.append("step", {"step": 0}).ok
    lines = lines_of(path.read_bytes())
    last = rec(lines[-1])
    body = {k: v for k, v in last.items() if k != "h"}
    body["closed"] = "yes"
    line, _ = seal(body)
    path.write_bytes(b"".join([*lines[:-1], line]))
    report = verify(path)
    assert report.failure is not None and report.failure.code == "PARSE"
