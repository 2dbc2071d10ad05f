"""An agent given a policy path reloads it as a Gate given one does: a real file replaced during a run.

The scripted model replaces the file between its answers, so each step's calls are decided by the policy
the file held when the step's program ran; the audit log names each call's policy and records the change.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from policy_files import FlippingPolicy, replace_file

from proctor.agent import CodeAgent, ScriptedModel
from proctor.agent.models import Message
from proctor.audit import verify
from proctor.audit.lines import read_records
from proctor.errors import PolicyError
from proctor.policy import Policy
from proctor.policy.reload import PolicyRefused, PolicySource

from .conftest import TOOLS, policy_data, program

CLOSED = "prices are closed for the audit"
PRICE = program('''
try:
    print("price:", get_price("pear"))
except Exception as exc:
    print("refused:", exc)
''')
DONE = program('final_answer("done")')


def _closed(**extra: Any) -> dict[str, Any]:
    """The shared policy with price look-ups denied."""
    data = policy_data(**extra)
    data["rules"] = [{"name": "closed", "match": {"tool": "get_price"}, "decision": "deny", "reason": CLOSED},
                     *data["rules"]]
    return data


def _policy_file(tmp_path: Path) -> tuple[Path, Path]:
    """The shared policy written to the file an agent is given, and where the agent's audit log goes."""
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy_data()))
    return path, tmp_path / "audit.jsonl"


def _then(action: Callable[[], None], answer: str) -> Callable[[Sequence[Message]], str]:
    """A scripted answer that first does `action` (between the steps of the run)."""
    def respond(messages: Sequence[Message]) -> str:
        action()
        return answer
    return respond


def _records(path: Path) -> list[dict[str, Any]]:
    records, bad = read_records(path)
    assert bad == 0
    return records


def _price_calls(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(decision, policy fingerprint) of each recorded get_price intent, in order."""
    return [(r["decision"], r["policy_sha256"]) for r in records
            if r["kind"] == "call_intent" and r["tool"] == "get_price"]


def test_a_changed_file_takes_effect_at_the_next_call_and_is_audited(tmp_path: Path) -> None:
    """With no reload asked for, the replaced file is found at a check (every 500 ms at most) and decides the
    next step's call; the log records the change with both fingerprints, and each call names its policy."""
    path, audit_path = _policy_file(tmp_path)
    first, second = Policy.from_dict(policy_data()), Policy.from_dict(_closed())
    agent = CodeAgent(TOOLS, ScriptedModel([]), str(path), audit=audit_path)

    def deploy() -> None:
        replace_file(path, yaml.safe_dump(_closed()))
        deadline = time.monotonic() + 30  # the file is checked at most every 500 ms: wait for the check
        while agent.policy is None or agent.policy.sha256 != second.sha256:
            assert time.monotonic() < deadline, "the agent never loaded the replaced policy file"
            time.sleep(0.05)

    agent.model = ScriptedModel([PRICE, _then(deploy, PRICE), DONE])
    with agent:
        result = agent.run("What does a pear cost?")
    assert result.status == "done", result.error
    assert "price: 2.0" in result.steps[0].observation
    assert f"refused: get_price: denied: {CLOSED}" in result.steps[1].observation
    records = _records(audit_path)
    assert _price_calls(records) == [("allow", first.sha256), ("deny", second.sha256)]
    (changed,) = [r for r in records if r["kind"] == "policy_changed"]
    assert (changed["old_sha256"], changed["new_sha256"], changed["path"]) == (first.sha256, second.sha256,
                                                                               str(path))
    kinds = [r["kind"] for r in records]
    intents = [i for i, r in enumerate(records) if r["kind"] == "call_intent"]
    assert intents[0] < kinds.index("policy_changed") < intents[1]  # between the two calls, in the log's order
    assert verify(audit_path).ok


def test_a_bad_file_is_refused_with_its_located_error_and_the_old_policy_keeps_deciding(tmp_path: Path) -> None:
    path, audit_path = _policy_file(tmp_path)
    first, second = Policy.from_dict(policy_data()), Policy.from_dict(_closed())
    agent = CodeAgent(TOOLS, ScriptedModel([]), path, audit=audit_path)
    source = agent.policy_source
    assert source is not None and source.path == str(path)
    refusals: list[PolicyRefused] = []
    source.on_refused = refusals.append
    bad = yaml.safe_dump(_closed()).replace("decision: deny", "decision: dney")

    def break_it() -> None:
        replace_file(path, bad)
        assert source.reload() is False  # checked now: refused

    def fix_it() -> None:
        replace_file(path, yaml.safe_dump(_closed()))
        assert source.reload() is True

    agent.model = ScriptedModel([PRICE, _then(break_it, PRICE), _then(fix_it, PRICE), DONE])
    with agent:
        result = agent.run("What does a pear cost?")
    assert result.status == "done", result.error
    (refused,) = refusals
    assert refused.message.startswith(f"{path}:") and "dney" in refused.message
    assert refused.kept_sha256 == first.sha256
    # The bad file decided nothing: the step after it was decided by the old policy, the next by the fixed file.
    assert ["price: 2.0" in s.observation for s in result.steps[:3]] == [True, True, False]
    records = _records(audit_path)
    assert _price_calls(records) == [("allow", first.sha256), ("allow", first.sha256), ("deny", second.sha256)]
    assert [(r["old_sha256"], r["new_sha256"]) for r in records if r["kind"] == "policy_changed"] == [
        (first.sha256, second.sha256)]


def test_reload_new_runs_keeps_a_run_on_the_policy_it_started_with(tmp_path: Path) -> None:
    """A new policy that says `reload: new_runs` leaves the agent's run in flight on its first policy (and its
    run-wide budgets); the agent's next run gets the new one."""
    path, audit_path = _policy_file(tmp_path)
    first, second = Policy.from_dict(policy_data()), Policy.from_dict(_closed(reload="new_runs"))
    agent = CodeAgent(TOOLS, ScriptedModel([]), path, audit=audit_path)
    source = agent.policy_source
    assert source is not None

    def deploy() -> None:
        replace_file(path, yaml.safe_dump(_closed(reload="new_runs")))
        assert source.reload() is True

    agent.model = ScriptedModel([PRICE, _then(deploy, PRICE), DONE, PRICE, DONE])
    with agent:
        during = agent.run("What does a pear cost?")
        after = agent.run("And now?")
    assert during.status == after.status == "done"
    assert "price: 2.0" in during.steps[1].observation
    assert f"refused: get_price: denied: {CLOSED}" in after.steps[0].observation
    assert _price_calls(_records(audit_path)) == [("allow", first.sha256), ("allow", first.sha256),
                                                  ("deny", second.sha256)]


def test_a_bad_file_at_the_start_is_its_located_error(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy_data()).replace("decision: allow", "decision: alow", 1))
    with pytest.raises(PolicyError, match=f"^{path}:"):
        CodeAgent(TOOLS, ScriptedModel([]), path)


def test_a_policy_object_is_not_reloaded(tmp_path: Path) -> None:
    agent = CodeAgent(TOOLS, ScriptedModel([]), Policy.from_dict(policy_data()))
    assert agent.policy_source is None and agent.policy is agent.gate.policy


def test_a_tool_calling_agent_given_a_path_reloads_it_too(tmp_path: Path) -> None:
    from proctor.agent import ModelResponse, ToolCallingAgent

    path, audit_path = _policy_file(tmp_path)
    first, second = Policy.from_dict(policy_data()), Policy.from_dict(_closed())
    agent = ToolCallingAgent(TOOLS, ScriptedModel([]), path, audit=audit_path)
    source = agent.policy_source
    assert source is not None

    def deploy() -> ModelResponse:
        replace_file(path, yaml.safe_dump(_closed()))
        assert source.reload() is True
        return ModelResponse.calling(("get_price", {"item": "pear"}))

    agent.model = ScriptedModel([ModelResponse.calling(("get_price", {"item": "pear"})), lambda _: deploy(),
                                 ModelResponse.calling(("final_answer", {"answer": "done"}))])
    with agent:
        result = agent.run("What does a pear cost?")
    assert result.status == "done", result.error
    assert [(c.status, c.error is not None and CLOSED in c.error) for c in result.tool_calls[:2]] == [
        ("ok", False), ("denied", True)]
    records = _records(audit_path)
    assert _price_calls(records) == [("allow", first.sha256), ("deny", second.sha256)]
    assert [(r["old_sha256"], r["new_sha256"]) for r in records if r["kind"] == "policy_changed"] == [
        (first.sha256, second.sha256)]


class _DeployedAtRunStart(PolicySource):
    """A real policy file, replaced by `text` right after the first run's policy is pinned (its first `for_run`):
    a deploy landing as the run starts."""

    def __init__(self, path: Path, first: str, text: str) -> None:
        path.write_text(first)
        super().__init__(path, check_every_ms=0)
        self.text: str | None = text

    def for_run(self, run_id: str) -> Policy:
        policy = super().for_run(run_id)
        if self.text is not None:
            replace_file(Path(self.path), self.text)
            self.text = None
            self.reload()
        return policy


def test_a_managed_agents_own_reloading_policy_narrows_one_invocation_with_one_policy(tmp_path: Path) -> None:
    """A managed agent's own policy file replaced while the parent hands it a task: the layer that narrows the
    invocation's calls and the ledger its budgets count in come from one policy, the one its calls name
    (`layers[].policy_sha256`), never the decision from one file and the budgets from the next."""
    from proctor.agent import CodeAgent as Agent

    from .test_managed import parent_policy

    def own(budget: str) -> str:
        return yaml.safe_dump(policy_data(budgets=[{"name": budget, "limit": {"calls": 0}}]))

    texts = (own("first-budget"), own("second-budget"))
    shas = {Policy.from_string(text).sha256: name for text, name in zip(texts, ("first-budget", "second-budget"),
                                                                       strict=True)}
    source = FlippingPolicy(tmp_path / "researcher.yaml", texts)
    sub = Agent(TOOLS, ScriptedModel([program("try:\n    get_price('fig')\nexcept BudgetExceeded as e:\n"
                                              "    final_answer(e.budget)")] * 3), source, name="researcher",
                description="Finds prices.")
    audit_path = tmp_path / "audit.jsonl"
    asks = "final_answer([researcher(task='fig?') for _ in range(3)])"
    with Agent(TOOLS, ScriptedModel([program(asks)]), parent_policy(), managed_agents=[sub],
               audit=audit_path) as boss:
        result = boss.run("Three figs.")
    assert result.status == "done", result.error
    records = _records(audit_path)
    layers = {r["call_id"]: r["layers"][0]["policy_sha256"] for r in records
              if r["kind"] == "call_intent" and r.get("layers")}
    refused = [(layers[r["call_id"]], r["budget"]) for r in records if r["kind"] == "budget_exhausted"]
    assert len(refused) == 3, refused
    assert all(shas[sha] == budget for sha, budget in refused), refused


def test_a_managed_agent_stops_on_the_run_wide_budget_of_the_policy_its_pinned_run_is_decided_by(
        tmp_path: Path) -> None:
    """Under `reload: new_runs` the run keeps its first policy, run-wide budgets and all. A managed agent working in
    it stops when that policy's run-wide budget refuses its calls, even when the file now holds a policy without
    that budget (it took the run's stops from the file's current policy, and went on refused)."""
    first = policy_data(tools={"researcher": {"side_effect": "read"}},
                        budgets=[{"name": "run-calls", "limit": {"calls": 3}}])
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(first))
    loop = program("for _ in range(5):\n    try:\n        get_price('fig')\n    except BudgetExceeded:\n"
                   "        pass\n")
    sub = CodeAgent(TOOLS, ScriptedModel([loop, program("final_answer('went on')")]), name="researcher",
                    description="Finds prices.")
    boss = CodeAgent(TOOLS, ScriptedModel([]), path, managed_agents=[sub])
    source = boss.policy_source
    assert source is not None

    def deploy() -> None:
        replace_file(path, yaml.safe_dump({**first, "budgets": [], "reload": "new_runs"}))
        assert source.reload() is True

    asks = program("try:\n    final_answer(researcher(task='figs'))\nexcept Exception as e:\n"
                   "    final_answer(str(e))")
    boss.model = ScriptedModel([_then(deploy, asks)])
    with boss:
        result = boss.run("Figs.")
    assert result.status == "done", result.error
    assert "budget_exhausted" in str(result.answer) and "went on" not in str(result.answer), result.answer


def test_a_durable_run_stores_the_policy_its_run_started_with(tmp_path: Path) -> None:
    """The store keeps a durable run's policy fingerprint (a resume records it as the previous policy): the one
    its `run_started` names and its calls are decided by under `reload: new_runs`, not whatever the file held a
    moment later."""
    from proctor.store import RunStore

    source = _DeployedAtRunStart(tmp_path / "policy.yaml", yaml.safe_dump(policy_data(reload="new_runs")),
                                 yaml.safe_dump(_closed(reload="new_runs")))
    audit_path = tmp_path / "audit.jsonl"
    store = RunStore.open(f"sqlite:///{tmp_path}/runs.db")
    try:
        with CodeAgent(TOOLS, ScriptedModel([DONE]), source, audit=audit_path, store=store) as agent:
            result = agent.run("Nothing.")
        assert result.status == "done", result.error
        [started] = [r for r in _records(audit_path) if r["kind"] == "run_started"]
        assert store.get_run(result.run_id).policy_sha256 == started["policy_sha256"]
    finally:
        store.close()
