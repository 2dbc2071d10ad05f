"""`proctor audit verify | show | tail | keygen`: output, filters, following, and exit codes."""

from __future__ import annotations

import importlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pexpect
import pytest

from proctor.audit import AuditLog
from proctor.audit.follow import follow
from proctor.cli import main


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path]:
    assert main(["audit", "keygen", str(tmp_path / "writer.key")]) == 0
    capsys.readouterr()
    return tmp_path / "writer.key", tmp_path / "writer.key.pub"


@pytest.fixture
def log(tmp_path: Path, keys: tuple[Path, Path]) -> Path:
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, signing_key=keys[0], durability="flush") as audit:
        audit.append("run_started", {"run_id": "r1"})
        audit.append("call_intent", {"call_id": "c1", "run_id": "r1", "tool": "get_weather", "decision": "allow",
                                     "rules": ["reads"]})
        audit.append("call_outcome", {"call_id": "c1", "run_id": "r1", "tool": "get_weather", "status": "ok"})
        audit.append("call_intent", {"call_id": "c2", "run_id": "r2", "tool": "send_email",
                                     "decision": {"outcome": "deny", "rules": ["no-exfiltration"]}})
        audit.append("call_outcome", {"call_id": "c2", "run_id": "r2", "tool": "send_email", "status": "denied"})
    return path


def test_keygen_writes_a_private_and_a_public_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """keygen prints the key id, makes the private key 0600, and refuses to overwrite without --force."""
    out = tmp_path / "k"
    assert main(["audit", "keygen", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("ed25519:")
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert b"PUBLIC KEY" in Path(str(out) + ".pub").read_bytes()
    assert main(["audit", "keygen", str(out)]) == 1
    assert "--force" in capsys.readouterr().err
    assert main(["audit", "keygen", str(out), "--force"]) == 0


def test_verify_intact_log(log: Path, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """An intact log exits 0 and says so; with the pinned key the only warning is the run left open."""
    assert main(["audit", "verify", str(log), "--pubkey", str(keys[1])]) == 0
    out = capsys.readouterr().out
    assert "intact: 6 records" in out
    assert [line for line in out.splitlines() if line.startswith("warning")] == [
        "warning: unfinished runs: 1 run(s) started and never finished (r1): the writer was killed or crashed "
        "during them"]


def test_verify_reports_what_runs_left_open_and_strict_fails_on_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Unfinished runs, dangling intents, unresolved approvals and recoveries are warnings; --strict fails."""
    path = tmp_path / "a.jsonl"
    with AuditLog(path, durability="flush") as audit:
        audit.append("run_started", {"run_id": "r1"})
        audit.append("approval_requested", {"run_id": "r1", "call_id": "c1", "tool": "wire"})
        audit.append("call_intent", {"call_id": "c2", "run_id": "r1", "tool": "wire"})
        audit.append("run_started", {"run_id": "r2"})
        audit.append("run_finished", {"run_id": "r2", "status": "done"})
    assert main(["audit", "verify", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["unfinished_runs"], report["unresolved_approvals"], report["dangling_intents"]) == (
        ["r1"], ["c1"], ["c2"])
    assert report["recoveries"] == [] and report["run_problems"] == 3
    AuditLog(path).close()  # reopening (seq 6 says so) closes the dangling intent with a recovery record
    assert main(["audit", "verify", str(path), "--strict"]) == 1
    out = capsys.readouterr().out
    assert "unfinished runs: 1" in out and "unresolved approvals: 1" in out and "recovery records: 1" in out
    assert "FAILED (--strict)" in out
    assert main(["audit", "verify", str(path), "--strict", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["strict"] is True and report["recoveries"] == [7]


def test_verify_names_the_first_bad_record(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tampered log exits 1 and names code, seq, line and byte offset."""
    lines = log.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b'"status":"ok"', b'"status":"no"')
    log.write_bytes(b"".join(lines))
    assert main(["audit", "verify", str(log)]) == 1
    out = capsys.readouterr().out
    offset = len(lines[0]) + len(lines[1])
    assert f"HASH_MISMATCH at seq 2, line 3, byte offset {offset}" in out


def test_verify_json_report(log: Path, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints the report; a wrong key is CKPT_SIG and exit 1."""
    assert main(["audit", "verify", str(log), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["records"] == 6 and report["failure"] is None
    other = log.parent / "other.key"
    assert main(["audit", "keygen", str(other)]) == 0
    capsys.readouterr()
    assert main(["audit", "verify", str(log), "--json", "--pubkey", str(other) + ".pub"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["failure"]["code"] == "CKPT_SIG" and report["failure"]["seq"] == 5


def test_verify_with_trusted_checkpoint_catches_rollback(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A log cut back behind a saved checkpoint is ROLLBACK even without its side file."""
    saved = log.parent / "saved.checkpoint"
    saved.write_bytes(Path(str(log) + ".checkpoint").read_bytes())
    Path(str(log) + ".checkpoint").unlink()
    log.write_bytes(b"".join(log.read_bytes().splitlines(keepends=True)[:3]))
    assert main(["audit", "verify", str(log)]) == 0
    assert "unsealed tail" in capsys.readouterr().out
    assert main(["audit", "verify", str(log), "--trusted-checkpoint", str(saved)]) == 1
    assert "ROLLBACK at seq 3" in capsys.readouterr().out


def test_verify_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing log or checkpoint file, or no LOG argument, is a usage error."""
    assert main(["audit", "verify", str(tmp_path / "nope.jsonl")]) == 2
    (tmp_path / "x.jsonl").write_bytes(b"")
    assert main(["audit", "verify", str(tmp_path / "x.jsonl"), "--trusted-checkpoint", str(tmp_path / "n")]) == 2
    with pytest.raises(SystemExit) as caught:
        main(["audit", "verify"])
    assert caught.value.code == 2
    assert main(["audit"]) == 2
    capsys.readouterr()


@pytest.mark.process
def test_verify_workers_option(log: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """--workers takes a count or 'auto' (the default) and prints the same verdict either way; 0 is refused."""
    monkeypatch.setattr(importlib.import_module("proctor.audit.verify"), "_PARALLEL_MIN", 0)
    outputs = []
    for extra in ([], ["--workers", "auto"], ["--workers", "1"], ["--workers", "2"]):
        assert main(["audit", "verify", str(log), *extra]) == 0
        outputs.append(capsys.readouterr().out)
    assert len(set(outputs)) == 1 and "intact: 6 records" in outputs[0]
    for bad in ("0", "many"):
        with pytest.raises(SystemExit) as caught:
            main(["audit", "verify", str(log), "--workers", bad])
        assert caught.value.code == 2
        assert "expected a number of processes ≥ 1 or 'auto'" in capsys.readouterr().err


@pytest.mark.process
@pytest.mark.parametrize("workers", ["1", "auto"])
def test_verify_shows_a_progress_bar_on_a_terminal(tmp_path: Path, workers: str) -> None:
    """A log over 8 MiB gets a progress bar when stderr is a terminal, in both the sequential and parallel paths."""
    path = tmp_path / "big.jsonl"
    with AuditLog(path, durability="flush") as audit:
        while path.stat().st_size <= 8 << 20:
            for i in range(1000):
                audit.append("call_intent", {"call_id": f"c{i}", "tool": "t", "args": {"pad": "x" * 600}})
    child = pexpect.spawn(sys.executable, ["-m", "proctor.cli", "audit", "verify", str(path), "--workers", workers],
                          env={**os.environ, "COLUMNS": "100", "TERM": "xterm"}, timeout=60, encoding="utf-8")
    child.expect("verifying")
    child.expect("intact")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_show_filters(log: Path, wide: None, capsys: pytest.CaptureFixture[str]) -> None:
    """show lists records in a table and filters by run (with --table), tool, outcome and limit."""
    assert main(["audit", "show", str(log)]) == 0
    out = capsys.readouterr().out
    assert "6 of 6 records" in out and "get_weather" in out and "reads" in out and "no-exfiltration" in out
    assert main(["audit", "show", str(log), "--run", "r2", "--table"]) == 0
    out = capsys.readouterr().out
    assert "2 of 6 records" in out and "get_weather" not in out
    assert main(["audit", "show", str(log), "--tool", "get_weather", "--outcome", "ok"]) == 0
    assert "1 of 6 records" in capsys.readouterr().out
    assert main(["audit", "show", str(log), "--outcome", "deny"]) == 0
    assert "1 of 6 records" in capsys.readouterr().out
    assert main(["audit", "show", str(log), "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 of 6 records" in out and "checkpoint" in out


def test_tail_prints_the_last_records(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """tail -n N prints the last N records, one line each (or raw JSON)."""
    assert main(["audit", "tail", str(log), "-n", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "denied" in out[0] and "checkpoint" in out[1]
    assert main(["audit", "tail", str(log), "-n", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "checkpoint"


def test_follow_sees_new_records_and_holds_back_partial_lines(tmp_path: Path) -> None:
    """follow emits each new complete line once, waits for a partial line, and survives a cut tail."""
    path = tmp_path / "f.jsonl"
    path.write_bytes(b'{"a":1}\n')
    seen: list[bytes] = []
    done = threading.Event()
    thread = threading.Thread(
        target=follow, args=(path, seen.append),
        kwargs={"last": 5, "keep_following": True, "poll_s": 0.01, "stop": done.is_set},
    )
    thread.start()

    def wait_for(n: int) -> None:
        deadline = time.monotonic() + 5
        while len(seen) < n and time.monotonic() < deadline:
            time.sleep(0.01)

    try:
        wait_for(1)
        with open(path, "ab") as f:
            f.write(b'{"b":2}\n{"c":')
        wait_for(2)
        time.sleep(0.05)
        assert seen == [b'{"a":1}', b'{"b":2}']
        with open(path, "r+b") as f:  # a reopening writer cuts the torn line, then appends
            f.truncate(16)
        with open(path, "ab") as f:
            f.write(b'{"d":4}\n')
        wait_for(3)
    finally:
        done.set()
        thread.join(5)
    assert seen == [b'{"a":1}', b'{"b":2}', b'{"d":4}']


@pytest.mark.process
def test_tail_follow_runs_until_interrupted(log: Path, keys: tuple[Path, Path]) -> None:
    """`proctor audit tail -f` prints appended records and exits 0 on Ctrl-C."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "proctor.cli", "audit", "tail", "-f", "-n", "1", str(log)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        assert "checkpoint" in proc.stdout.readline()  # the last record: tail is up and following
        with AuditLog(log, signing_key=keys[0]) as audit:
            audit.append("step", {"run_id": "r9", "step": 1})
        assert "checkpoint" in proc.stdout.readline()  # the closed log says it was reopened, then the step
        line = proc.stdout.readline()
        assert "step" in line and "run=r9" in line
    finally:
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err


def test_show_json_approval_column_and_80_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`show --json` prints the records; the table names who approved and fits 80 columns, one line a record."""
    path = tmp_path / "a.jsonl"
    with AuditLog(path, durability="flush") as audit:
        audit.append("run_started", {"run_id": "run_" + "f" * 32})
        audit.append("approval_resolved", {"run_id": "run_" + "f" * 32, "call_id": "c1", "tool": "send_email",
                                           "verdict": "approve", "approver": "carol"})
        audit.append("call_intent", {"call_id": "c1", "run_id": "run_" + "f" * 32, "tool": "send_email",
                                     "decision": "require_approval", "rules": ["external-mail"],
                                     "approval": {"verdict": "approve", "approver": "carol"}})
    assert main(["audit", "show", str(path), "--json", "--tool", "send_email"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [r["kind"] for r in shown] == ["approval_resolved", "call_intent"]
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["audit", "show", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 80 for line in lines) and len(lines) == 1 + 1 + 4 + 1  # title, header, records, run
    assert "approve by carol" in lines[3] and "approve by carol" in lines[4]


def test_show_of_garbage_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file that holds no record at all is not an audit log: exit 1, naming verify."""
    path = tmp_path / "junk.txt"
    path.write_bytes(b"hello\nworld\n\x00\xff\n")
    assert main(["audit", "show", str(path)]) == 1
    assert "proctor audit verify" in capsys.readouterr().err


@pytest.mark.process
def test_tail_follow_waits_for_a_log_that_does_not_exist_yet(tmp_path: Path) -> None:
    """`tail -f` on a missing log waits, then prints records once the log appears."""
    path = tmp_path / "later.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "proctor.cli", "audit", "tail", "-f", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        assert proc.stderr is not None and "waiting for it" in proc.stderr.readline()
        with AuditLog(path, durability="flush") as audit:
            audit.append("run_started", {"run_id": "r-late"})
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "run_started" in line and "r-late" in line and time.monotonic() < deadline
        assert proc.poll() is None  # still following
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
