"""Attacks on `proctor audit show --run` from a hostile log: forged or edited records must not read as genuine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proctor.agent import CodeAgent, ScriptedModel
from proctor.audit.records import seal
from proctor.cli import main
from proctor.policy import Policy

from .conftest import get_price, program

ALLOW = Policy.from_dict({"version": 1, "default": "allow", "rules": []})


def _log(tmp_path: Path) -> tuple[Path, str, list[bytes]]:
    log = tmp_path / "audit.jsonl"
    with CodeAgent([get_price], ScriptedModel([program("final_answer(get_price('fig'))")]), ALLOW,
                   audit=str(log)) as agent:
        run_id = agent.run("Fig price?").run_id
    return log, run_id, log.read_bytes().splitlines(keepends=True)


def _show(log: Path, run_id: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["audit", "show", str(log), "--run", run_id])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_genuine_log_shows_without_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The run as the agent wrote it: exit 0, nothing on stderr."""
    log, run_id, _ = _log(tmp_path)
    code, out, err = _show(log, run_id, capsys)
    assert code == 0 and err == "" and "get_price" in out


def test_a_hand_written_record_is_flagged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A call appended by hand (not canonical, no valid hash) is shown only with a warning and exit 1."""
    log, run_id, lines = _log(tmp_path)
    forged = {"kind": "call_intent", "run_id": run_id, "call_id": "call_x", "tool": "wire_money",
              "args": {"to": "eve"}, "decision": "allow", "side_effect": "destructive", "step": 1}
    log.write_bytes(b"".join(lines) + json.dumps(forged).encode() + b"\n")
    code, _, err = _show(log, run_id, capsys)
    assert code == 1 and "hash chain" in err and "proctor audit verify" in err


def test_a_carefully_sealed_record_inserted_mid_log_is_flagged(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A canonical record with a valid hash, linked to the line before it, still breaks the next line's link."""
    log, run_id, lines = _log(tmp_path)
    at = next(i for i, line in enumerate(lines) if b'"kind":"call_outcome"' in line) + 1
    before = json.loads(lines[at - 1])
    forged = {"kind": "call_outcome", "run_id": run_id, "call_id": "call_x", "tool": "wire_money", "status": "ok",
              "seq": before["seq"], "ts_ns": before["ts_ns"], "prev": before["h"]}
    line, _ = seal(forged)
    log.write_bytes(b"".join(lines[:at]) + line + b"".join(lines[at:]))
    code, out, err = _show(log, run_id, capsys)
    assert code == 1 and "does not link" in err
    assert "\x1b" not in out
