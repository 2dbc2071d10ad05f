"""`proctor audit show --run RUN_ID`: a finished run read back step by step from the audit log alone."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from proctor.agent import CodeAgent, ScriptedModel
from proctor.agent.render import calls_table
from proctor.agent.replay import run_from_log
from proctor.approval import CallbackApprover
from proctor.calls import CallRecord
from proctor.cli import main
from proctor.policy import Policy

from .conftest import TOOLS, policy_data, program

STEP_1 = program('''
print("apple costs", get_price("apple"))
send_note("boss", "prices are in")
delete_item("fig")
''', thought="Thought: price the apple, tell the boss, clean up.")
STEP_2 = program('final_answer("plum")', thought="Thought: the plum it is.")


def _shown(log: Path, run_id: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["audit", "show", str(log), "--run", run_id]) == 0
    return capsys.readouterr().out


def _table(calls: list[CallRecord]) -> str:
    out = io.StringIO()
    Console(file=out, width=120, highlight=False).print(calls_table(calls))
    return out.getvalue()


def test_audit_show_run_prints_each_step_from_the_log_as_replay_does(
        policy: Policy, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Thought, program, each call with decision, rule, approval and outcome, and the summary, from the file alone."""
    log = tmp_path / "audit.jsonl"
    approver = CallbackApprover(lambda _req: True)
    with CodeAgent(TOOLS, ScriptedModel([STEP_1, STEP_2]), policy, approver=approver, audit=str(log),
                   sandbox="auto") as agent:
        result = agent.run("Which fruit?")
    assert result.status == "done"
    text = _shown(log, result.run_id, capsys)
    for expected in ("step 1", "step 2", "Thought: price the apple, tell the boss, clean up.",
                     "Thought: the plum it is.", 'send_note("boss", "prices are in")',
                     "get_price(item='apple')", "reads", "require_approval", "other-notes", "approve by callback",
                     "deny", "no-deletes", "ToolDenied", "summary", "done", "denied by policy",
                     "approved by the approver", "not kept in the audit log"):
        assert expected in text, (expected, text)
    assert text.index("step 1") < text.index("get_price(item='apple')") < text.index("step 2") \
        < text.index("summary")
    # The calls of each step read the same from the log as from the agent's memory.
    replayed = run_from_log(log, result.run_id)
    assert replayed.ended == "finished" and replayed.result.status == "done"
    assert [_table(s.tool_calls) for s in replayed.result.steps] == [_table(s.tool_calls) for s in result.steps]
    assert [s.code for s in replayed.result.steps] == [s.code for s in result.steps]


def test_the_log_never_holds_a_redacted_value_in_the_thought_or_program(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A program and thought quoting a redacted argument reach the log and the replay scrubbed."""
    policy = Policy.from_dict(policy_data(tools={"send_note": {"redact": ["text"]}}))
    secret = "card 4111-1111-1111-1111"
    step = program(f'send_note("team", "{secret}")\nfinal_answer("sent")',
                   thought=f"Thought: I will send {secret} to the team.")
    log = tmp_path / "audit.jsonl"
    with CodeAgent(TOOLS, ScriptedModel([step]), policy, audit=str(log), sandbox="auto") as agent:
        result = agent.run("Send the card")
    assert result.status == "done"
    assert secret not in log.read_text()
    [record] = [json.loads(line) for line in log.read_text().splitlines() if '"kind":"step"' in line]
    assert record["thought"].startswith("Thought: I will send ") and record["code"].startswith("send_note(")
    text = _shown(log, result.run_id, capsys)
    assert secret not in text and "Thought: I will send" in text and "send_note(" in text


def test_what_the_model_wrote_cannot_drive_the_terminal(tmp_path: Path, policy: Policy,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Escape sequences in the thought and the program are shown escaped, never sent to the terminal."""
    step = program('final_answer("x")  # \x1b[2J', thought="Thought: \x1b[6A\x1b[J gone \u202e")
    log = tmp_path / "audit.jsonl"
    with CodeAgent(TOOLS, ScriptedModel([step]), policy, audit=str(log), sandbox="auto") as agent:
        run_id = agent.run("go").run_id
    text = _shown(log, run_id, capsys)
    assert "\x1b" not in text and "\u202e" not in text
    assert "\\x1b[6A" in text and "\\u202e" in text


def test_a_run_cut_short_says_it_has_no_end(tmp_path: Path, policy: Policy,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A log that stops mid-step (a killed process) shows the calls it has and says the run has no end."""
    log = tmp_path / "audit.jsonl"
    with CodeAgent(TOOLS, ScriptedModel([STEP_1, STEP_2]), policy, approver=CallbackApprover(lambda _r: True),
                   audit=str(log), sandbox="auto") as agent:
        run_id = agent.run("Which fruit?").run_id
    lines = log.read_text().splitlines(keepends=True)
    # What a SIGKILL leaves: everything up to the first call's outcome, then nothing.
    cut = next(i for i, line in enumerate(lines) if '"kind":"call_outcome"' in line)
    log.write_text("".join(lines[:cut + 1]))
    text = _shown(log, run_id, capsys)
    assert "get_price(item='apple')" in text and "unfinished" in text
    assert "no end for this run" in text and "no step record" in text


def test_an_unknown_run_is_one_line_and_exit_1(tmp_path: Path, policy: Policy,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A run id the log does not hold is an error saying how to list the runs."""
    log = tmp_path / "audit.jsonl"
    with CodeAgent(TOOLS, ScriptedModel([STEP_2]), policy, audit=str(log), sandbox="auto") as agent:
        agent.run("go")
    assert main(["audit", "show", str(log), "--run", "run_nope"]) == 1
    err = capsys.readouterr().err
    assert "run_nope" in err and "proctor audit show LOG" in err and len(err.strip().splitlines()) == 1


def test_a_hostile_log_cannot_drive_the_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Escapes in any field of a hand-written log (tool, rules, approval, status, pending) are shown escaped."""
    from proctor.audit import AuditLog

    esc = "\x1b[2J\x1b]0;pwned\x07"
    log = tmp_path / "audit.jsonl"
    with AuditLog(log, durability="flush") as audit:
        audit.append("run_started", {"run_id": "r1"})
        audit.append("call_intent", {"run_id": "r1", "step": 1, "call_id": "c1", "tool": "t" + esc,
                                     "side_effect": "read", "args": {"k" + esc: "v" + esc}, "decision": "deny",
                                     "rules": ["r" + esc], "approval": {"verdict": "denied", "approver": esc}})
        audit.append("call_outcome", {"run_id": "r1", "call_id": "c1", "tool": "t", "status": "denied",
                                      "error": esc})
        audit.append("step", {"run_id": "r1", "step": 1, "step_kind": "action", "thought": esc, "code": esc,
                              "call_ids": ["c1"], "error": esc,
                              "images": [{"from": "call", "tool": esc, "format": esc, "sha256": esc}]})
        audit.append("run_suspended", {"run_id": "r1", "step": 1, "pending": [esc]})
        audit.append("run_resumed", {"run_id": "r1", "step": 1})
        audit.append("run_finished", {"run_id": "r1", "status": "done" + esc, "error": esc})
    text = _shown(log, "r1", capsys)
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b[2J" in text and "unknown" in text


def test_without_a_log_path_show_reads_the_log_proctor_run_writes_by_default(
        tmp_path: Path, policy: Policy, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`proctor audit show --run ID` alone reads $PROCTOR_AUDIT, the log `proctor run` uses without --audit."""
    log = tmp_path / "default.jsonl"
    with CodeAgent(TOOLS, ScriptedModel([STEP_2]), policy, audit=str(log), sandbox="auto") as agent:
        run_id = agent.run("go").run_id
    monkeypatch.setenv("PROCTOR_AUDIT", str(log))
    assert main(["audit", "show", "--run", run_id]) == 0
    assert "Thought: the plum it is." in capsys.readouterr().out
    monkeypatch.setenv("PROCTOR_AUDIT", str(tmp_path / "none.jsonl"))
    assert main(["audit", "show", "--run", run_id]) == 2
    assert "no LOG given" in capsys.readouterr().err
