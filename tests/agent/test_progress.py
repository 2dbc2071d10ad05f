"""`proctor run`'s progress line: live on a terminal (a real pty), absent from pipes, paused for approvals."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pexpect
import pytest

from proctor.agent.progress import PausingApprover, ProgressLine
from proctor.agent.result import StepRecord
from proctor.approval import CallbackApprover
from proctor.calls import CallRecord

from .openai_server import completion, serve

# `proctor run` on a terminal: the agent's sandboxed worker (tests/conftest.py, tiers).
pytestmark = pytest.mark.sandbox

ROOT = Path(__file__).resolve().parents[2]
TOOLS = '''\
import time
from proctor import tool

@tool(side_effect="read")
def tick(seconds: float) -> str:
    """Wait a little.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "ticked"
'''
POLICY = "version: 1\ndefault: deny\nrules:\n  - {name: ticks, match: {tool: tick}, decision: allow}\n"
PROGRAM = 'Thought: wait.\n```python\ntick(0.0)\ntick(3.0)\nfinal_answer("waited")\n```'
ERASE = "\r\x1b[2K"


def _setup(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    (tmp_path / "tick_tools.py").write_text(TOOLS)
    (tmp_path / "policy.yaml").write_text(POLICY)
    env = {**os.environ, "OPENAI_API_KEY": "", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "COLUMNS": "100",
           "TERM": "xterm", "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    args = ["-m", "proctor.cli", "run", "Wait", "--tools", "tick_tools", "--policy", str(tmp_path / "policy.yaml"),
            "--audit", str(tmp_path / "audit.jsonl"), "--model", "openai/gpt-4o-mini", "--model-arg", "api_key=test"]
    return args, env


def test_on_a_terminal_the_line_shows_the_running_program_and_is_erased_before_the_calls(tmp_path: Path) -> None:
    """Under a pty the line counts the calls made so far while the program runs, then is erased."""
    args, env = _setup(tmp_path)
    with serve([completion(PROGRAM)]) as fake:
        child = pexpect.spawn(sys.executable, [*args, "--model-arg", f"api_base={fake.base}"], cwd=str(tmp_path),
                              env=env, encoding="utf-8", timeout=180, dimensions=(40, 100))
        child.logfile_read = transcript = io.StringIO()
        try:
            child.expect("step 1: program running · 1 call · ")
            child.expect("last: tick ok")
            child.expect("summary")
            child.expect(pexpect.EOF)
        finally:
            child.close()
    seen = transcript.getvalue()
    assert child.exitstatus == 0, seen
    assert "waited" in seen
    # The line is erased before the calls table is printed, and never drawn after it.
    table = seen.index("tick(seconds=3.0)")
    assert ERASE in seen[:table] and "program running" not in seen[table:]


def test_in_a_pipe_there_is_no_line_and_no_escape(tmp_path: Path) -> None:
    """With stdout a pipe (CI, `| tee`), the output holds the steps and no carriage return or escape sequence."""
    args, env = _setup(tmp_path)
    with serve([completion(PROGRAM)]) as fake:
        proc = subprocess.run([sys.executable, *args, "--model-arg", f"api_base={fake.base}"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert "tick(seconds=3.0)" in proc.stdout and "summary" in proc.stdout
    assert "program running" not in proc.stdout + proc.stderr
    assert "\r" not in proc.stdout and "\x1b" not in proc.stdout


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_line_is_cut_to_the_width_escaped_and_paused_for_an_approval() -> None:
    """A long, hostile tool name never wraps or reaches the terminal raw; an approval prompt gets a clean line."""
    out = _Tty()
    line = ProgressLine(out, interval=0.01, enabled=True)
    line.start(StepRecord(2, code="x()"))
    line.call(2, CallRecord("c1", "evil\x1b[2J" + "x" * 300, {}, "read", None, "ok", 0))
    assert "\x1b[2J" not in line.text(60) and len(line.text(60)) <= 59 and "\\x1b[2J" in line.text(200)
    asked: list[str] = []

    def ask(_request: object) -> bool:
        before = len(out.getvalue())
        time.sleep(0.1)  # several redraw intervals: none may happen while the human is asked
        asked.append(out.getvalue()[before:])
        return True

    time.sleep(0.05)
    wrapped = PausingApprover.around(CallbackApprover(ask), line)
    assert type(wrapped).__name__ == "CallbackApprover"  # how the gate names the approver in the audit log
    wrapped.request(_request())
    line.stop()
    assert asked == [""]
    text = out.getvalue()
    assert "step 2: program running · 1 call" in text and text.endswith(ERASE)


def test_an_approval_asked_elsewhere_is_named_on_the_line() -> None:
    """With a webhook-like approver the line stays up and says which call waits for an answer."""
    out = _Tty()
    line = ProgressLine(out, interval=0.01, enabled=True)
    line.start(StepRecord(1, code="x()"))
    seen: list[str] = []

    def ask(_request: object) -> bool:
        time.sleep(0.1)
        seen.append(out.getvalue())
        return True

    PausingApprover.around(CallbackApprover(ask), line, terminal=False).request(_request())
    line.stop()
    assert "waiting for approval of t" in seen[0]
    assert "waiting for approval" not in line.text(200)


def _request() -> object:
    from proctor.approval.base import ApprovalRequest

    return ApprovalRequest(call_id="c2", tool="t", side_effect="write", args={}, rules=(), reason="",
                           policy_sha256="", budget={}, expires_at_ns=time.time_ns() + 10**10, binding="")


def test_an_approval_asked_at_the_terminal_gets_a_clean_screen(tmp_path: Path) -> None:
    """Under a pty, the line is erased before the approval panel and not redrawn until the answer."""
    args, env = _setup(tmp_path)
    (tmp_path / "policy.yaml").write_text(POLICY.replace("decision: allow", "decision: require_approval"))
    with serve([completion(PROGRAM)]) as fake:
        child = pexpect.spawn(sys.executable, [*args, "--model-arg", f"api_base={fake.base}"], cwd=str(tmp_path),
                              env=env, encoding="utf-8", timeout=180, dimensions=(40, 100))
        child.logfile_read = transcript = io.StringIO()
        try:
            child.expect(r"\[a\]pprove")
            child.expect("> ")
            asked = transcript.getvalue()
            time.sleep(1.0)  # a few redraw intervals: the line must stay away while the human reads
            child.sendline("a")
            child.expect("> ")  # the second call asks too
            child.sendline("a")
            child.expect("summary")
            child.expect(pexpect.EOF)
        finally:
            child.close()
    seen = transcript.getvalue()
    assert child.exitstatus == 0, seen
    panel = asked.rindex("tick")  # the panel names the call; the line was erased before it
    assert "program running" not in asked[panel:]
    assert "program running" not in seen[len(asked):seen.index("\n", len(asked))]
