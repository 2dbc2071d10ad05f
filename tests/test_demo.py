"""Tests of `proctor demo`: the whole story without a terminal, with --no, and interactive on a pty."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pexpect
from rich.console import Console

from proctor.agent.demo.app import DemoOptions, run_demo
from proctor.audit import verify


def _demo(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proctor.cli", "demo", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_demo_without_a_terminal_exits_0_with_the_summary(tmp_path: Path) -> None:
    """Without a terminal the demo approves automatically, says so, and ends with its summary table."""
    proc = _demo("--audit", str(tmp_path / "audit.jsonl"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "answered automatically: approve (no terminal" in out
    for part in ("step 1", "step 4", "summary", "budget_exhausted", "allowed", "approved by the approver",
                 "denied by policy", "refused by a budget", "intact:", "trace id", "run-calls: 14/14 calls"):
        assert part in out, part
    assert verify(tmp_path / "audit.jsonl", pubkey=tmp_path / "audit.jsonl.key.pub").ok


def test_demo_no_denies_the_external_mail(tmp_path: Path) -> None:
    """With --no the mail to the customer is refused by the approver and never sent."""
    proc = _demo("--no", "--audit", str(tmp_path / "a.jsonl"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "answered automatically: deny (--no" in proc.stdout
    assert "refused by the approver" in proc.stdout
    assert "email to dana.kim@example.net" not in proc.stdout
    assert "email to support-leads@acme.example" in proc.stdout


def test_demo_story_in_process(tmp_path: Path) -> None:
    """The run allows, denies, asks a human and is stopped by the run's call budget; every call is recorded."""
    console = Console(file=io.StringIO(), width=120)
    code, result = run_demo(DemoOptions(answer=True, audit=str(tmp_path / "audit.jsonl")), console)
    assert code == 0
    assert result.status == "budget_exhausted" and result.error is not None and "run-calls" in result.error
    outcomes = [(c.tool, c.decision.outcome if c.decision else None, c.status) for c in result.tool_calls]
    assert ("issue_refund", "allow", "ok") in outcomes and ("issue_refund", "deny", "denied") in outcomes
    assert ("send_email", "require_approval", "ok") in outcomes
    assert outcomes[-1] == ("get_order", "allow", "denied")
    assert result.tool_calls[-1].error_type == "BudgetExceeded"
    assert [len(s.tool_calls) for s in result.steps] == [5, 2, 2, 7]
    assert result.trace_id is not None and len(result.trace_id) == 32


def test_demo_asks_on_a_terminal(tmp_path: Path) -> None:
    """On a terminal the approval is asked at the console; answering 'a' approves the mail."""
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    child = pexpect.spawn(sys.executable, ["-m", "proctor.cli", "demo", "--audit", str(tmp_path / "a.jsonl")],
                          cwd=str(tmp_path), env=env, encoding="utf-8", timeout=60)
    try:
        child.expect("you, at this terminal")
        child.expect(r"\[a\]pprove")
        child.expect("> ")
        child.sendline("a")
        child.expect("summary")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert "approved by the approver" in (child.before or "")


def test_demo_never_claims_an_export_that_failed(tmp_path: Path) -> None:
    """With --otlp to a port where nothing listens, the summary says the export failed, not that it happened."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    env_timeout = {"OTEL_EXPORTER_OTLP_TIMEOUT": "1", "OTEL_METRICS_EXPORTER": "none"}
    proc = subprocess.run([sys.executable, "-m", "proctor.cli", "demo", "--audit", str(tmp_path / "a.jsonl"),
                           "--otlp", f"http://127.0.0.1:{port}", "--otlp-protocol", "http/protobuf"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={**os.environ, **env_timeout, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert "spans exported to" not in proc.stdout
    assert "FAILED" in proc.stdout or "did not finish in time" in proc.stdout, proc.stdout


def test_demo_keys_sit_in_a_private_directory() -> None:
    """Without --audit the demo's log, signing key and redaction key go to a directory only the user can read."""
    import stat

    console = Console(file=io.StringIO(), width=120)
    code, result = run_demo(DemoOptions(answer=True, interactive=False), console=console)
    assert code == 0 and result.audit_path is not None
    folder = Path(result.audit_path).parent
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name in ("audit.jsonl.key", "audit.jsonl.redact-key"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
