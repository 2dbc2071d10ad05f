"""The call a run suspends at is journaled: a resumed program that goes another way there stops, nothing runs twice."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from durable_helpers import policy_dict
from durable_tools import TOOLS, count
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiers import examples

from proctor import CodeAgent, InboxApprover, Policy, RunStore, ScriptedModel
from proctor.store import AnswerSeal, ApprovalAnswer

# The attack of issue 28: a side effect, then a branch on the time, which has moved on when the run resumes.
ATTACK = """```py
import time
send('a@example.com', 'one')
if time.time() < {deadline!r}:
    send('x@evil.test', 'needs a human')
else:
    send('a@example.com', 'one')
final_answer('done')
```"""
GAVE_UP = "```py\nfinal_answer('gave up')\n```"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RunStore, Path]]:
    monkeypatch.setenv("DURABLE_COUNTER", str(tmp_path / "effects.jsonl"))
    store = RunStore.open(f"sqlite:///{tmp_path}/runs.db")
    yield store, tmp_path
    store.close()


def _agent(store: RunStore, tmp: Path, responses: list[str]) -> CodeAgent:
    return CodeAgent(TOOLS, ScriptedModel(responses), Policy.from_dict(policy_dict()),
                     approver=InboxApprover(store, wait="0s"), audit=str(tmp / "audit.jsonl"), store=store,
                     sandbox="process", authorized_imports=["time"])


def _approve_all(store: RunStore, tmp: Path) -> None:
    seal = AnswerSeal.of_trail(str(tmp / "audit.jsonl"))  # as the inbox or the CLI seal an answer
    for pending in store.list_approvals(status="pending"):
        store.answer_approval(pending.id, seal.sealed(pending, ApprovalAnswer("approve", "bob")),
                              binding=pending.binding)


def _kinds(tmp: Path) -> list[str]:
    return [json.loads(line)["kind"] for line in (tmp / "audit.jsonl").read_text().splitlines()]


def test_a_program_that_changes_path_at_the_suspended_call_stops_and_runs_nothing_twice(
        env: tuple[RunStore, Path]) -> None:
    store, tmp = env
    deadline = time.time() + 8
    with _agent(store, tmp, [ATTACK.format(deadline=deadline)]) as agent:
        first = agent.run("mail it", principal="alice")
    assert first.status == "suspended"
    [entry] = [e for e in store.journal(first.run_id, 1) if e.state == "suspended"]
    assert (entry.tool, entry.seq) == ("send", 1)
    time.sleep(max(0.0, deadline - time.time()) + 0.1)  # the world moved on while the run waited
    _approve_all(store, tmp)
    with _agent(store, tmp, [GAVE_UP]) as agent:
        resumed = agent.resume(first.run_id)
    sends = [c for c in count(str(tmp / "effects.jsonl")) if c[0] == "send"]
    assert sends == [["send", {"to": "a@example.com", "body": "one"}]]  # once, never twice
    assert "went another way" in (resumed.steps[0].error or "")
    assert "replay_diverged" in _kinds(tmp)
    assert resumed.status == "done" and resumed.answer == "gave up"


def test_the_same_call_at_the_suspended_place_goes_on_to_its_answer(env: tuple[RunStore, Path]) -> None:
    store, tmp = env
    with _agent(store, tmp, [ATTACK.format(deadline=time.time() + 3600)]) as agent:
        first = agent.run("mail it", principal="alice")
    _approve_all(store, tmp)
    with _agent(store, tmp, []) as agent:
        resumed = agent.resume(first.run_id)
    assert resumed.status == "done" and resumed.answer == "done"
    assert [c[1]["body"] for c in count(str(tmp / "effects.jsonl")) if c[0] == "send"] == ["one", "needs a human"]


# A generated program: a few calls, each guarded by a fact of the moment it runs (a bit of the clock, the
# hash of a string, the order of a set: what differs between a run and its resume); some need a human.
CALLS = {"internal": "send('a@example.com', {body!r})", "external": "send('x@evil.test', {body!r})",
         "read": "look({n})"}
FACTS = ["(time.time_ns() >> {k}) & 1", "hash('proctor{k}') & 1", "next(iter({{'a{k}', 'b{k}', 'c{k}'}})) < 'b'"]
call = st.tuples(st.sampled_from(["external", "internal", "internal", "read"]),
                 st.sampled_from(range(len(FACTS))), st.integers(8, 12))
# At least one call that suspends, then whatever follows it.
program = st.tuples(st.tuples(st.just("external"), st.just(0), st.integers(8, 12)),
                    st.lists(call, min_size=1, max_size=4)).map(lambda t: [t[0], *t[1]])


def _source(calls: list[tuple[str, int, int]]) -> str:
    lines = ["import time", "send('a@example.com', 'first')"]  # an effect before any branch
    for i, (kind, fact, k) in enumerate(calls):
        lines.append(f"if {FACTS[fact].format(k=k)}:")
        lines.append("    " + CALLS[kind].format(body=f"b{i}", n=i))
    lines.append("final_answer('end')")
    return "```py\n" + "\n".join(lines) + "\n```"


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=program)
def test_no_side_effect_runs_twice_whatever_the_program_sees_when_it_resumes(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
        calls: list[tuple[str, int, int]]) -> None:
    tmp = tmp_path_factory.mktemp("world")
    monkeypatch.setenv("DURABLE_COUNTER", str(tmp / "effects.jsonl"))
    store = RunStore.open(f"sqlite:///{tmp}/runs.db")
    effects = str(tmp / "effects.jsonl")
    try:
        with _agent(store, tmp, [_source(calls)]) as agent:
            result = agent.run("go", principal="alice")
        for _ in range(4):  # resume until it ends: each resume is a new worker, a new clock, a new hash seed
            if result.status != "suspended":
                break
            [waiting] = store.list_approvals(status="pending")
            before = len(count(effects))
            _approve_all(store, tmp)
            with _agent(store, tmp, [GAVE_UP]) as agent:
                result = agent.resume(result.run_id)
            new = [e[1]["body"] for e in count(effects)[before:] if e[0] == "send"]
            # What runs after a resume starts with the approved call, or nothing runs: a program that went
            # another way at the suspended call (or before it) is stopped there.
            assert not new or new[0] == waiting.args["body"], (new, waiting.args)
        bodies = [e[1]["body"] for e in count(effects) if e[0] == "send"]
        assert len(bodies) == len(set(bodies)), bodies  # every line's body is its own: a repeat ran twice
    finally:
        store.close()
