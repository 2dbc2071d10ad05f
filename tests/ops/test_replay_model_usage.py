"""Replay and a condition on the model's usage: a log records a step's model usage after the step's calls, while
the gate charged it before them, so such a condition is not decided again (it was decided on 0 tokens)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proctor import CodeAgent, Policy, ScriptedModel, tool
from proctor.policy.replay import replay_log

pytestmark = [pytest.mark.sandbox]  # the agent's programs run in a worker

RECORDED = """
version: 1
budgets:
  - name: model
    limit: {model_tokens: 1000000}
rules:
  - {name: reads, match: {side_effect: read}, decision: allow}
"""


@tool(side_effect="read")
def lookup(order: str) -> str:
    """Look an order up.

    Args:
        order: Order id.
    """
    return f"order {order}"


def _agent_log(tmp_path: Path) -> Path:
    """A real agent run: three steps, each asking the model (tokens charged) and then calling `lookup`."""
    log = tmp_path / "audit.jsonl"
    steps = [f"```python\nlookup(order='{n}')\n```" for n in range(3)] + ["```python\nfinal_answer('done')\n```"]
    agent = CodeAgent([lookup], ScriptedModel(steps), Policy.from_string(RECORDED), audit=str(log), sandbox="process")
    try:
        assert agent.run("look the orders up").status == "done"
    finally:
        agent.close()
    return log


def _with_rule(name: str, when: str, policy: str = RECORDED) -> Policy:
    """`policy` with one more rule: `name` denies a read call `when` holds."""
    return Policy.from_string(policy.replace("decision: allow}", "decision: allow}\n"
                              f"  - name: {name}\n    match: {{side_effect: read}}\n"
                              f"    when: \"{when}\"\n    decision: deny\n"))


def test_a_condition_on_model_tokens_is_undecidable_not_decided_on_zero(tmp_path: Path) -> None:
    """Under the candidate every call is refused live (the first reply was charged before the first program);
    replay said "unchanged" for each, as if the run had used no tokens."""
    log = _agent_log(tmp_path)
    candidate = _with_rule("token-hog", "usage['model'].model_tokens > 0")
    report = replay_log(candidate, str(log))
    assert (report.decided, report.changed, report.undecidable) == (0, 0, 3)
    assert all("model's usage" in u.why for u in report.undecidable_examples), report.undecidable_examples


def test_a_condition_on_a_budgets_calls_is_still_decided(tmp_path: Path) -> None:
    """Only the model's fields are unknown: a budget's calls are rebuilt from the calls, and decided."""
    log = _agent_log(tmp_path)
    candidate = _with_rule("third-call", "usage['model'].calls >= 2")
    report = replay_log(candidate, str(log))
    assert (report.decided, report.changed, report.undecidable) == (3, 1, 0)


def test_coverage_does_not_call_a_model_budget_never_approached(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`model: peak 0%` under "never approached" for a run that used its tokens: its peak is said not known."""
    from proctor.cli import main

    log = _agent_log(tmp_path)
    policy = tmp_path / "policy.yaml"
    policy.write_text(RECORDED)
    assert main(["policy", "coverage", str(policy), "--audit", str(log)]) == 0
    text = capsys.readouterr().out
    assert "budgets never approached (peak use under 50%): 0" in text
    assert "budgets on the model's usage only, not replayed (the steps' usage is in the log): 1\n  model" in text
    assert main(["policy", "coverage", str(policy), "--audit", str(log), "--json"]) == 0
    assert '"replayed": false' in capsys.readouterr().out


@pytest.mark.parametrize("condition", [
    "usage['model']['model_' + 'tokens'] > 0",  # the field's name computed
    "usage.exists(b, usage[b].exists(k, k.startsWith('model') && usage[b][k] > 0))",  # every field of every budget
    "usage['model'].exists(k, k.endsWith('_usd') && usage['model'][k] > 0.0)",  # a bound key
    "[usage['model']].exists(u, u['model' + '_tokens'] > 0)",  # the budget's usage passed whole
])
def test_a_condition_that_can_read_the_models_usage_without_naming_it_is_undecidable(tmp_path: Path,
                                                                                     condition: str) -> None:
    """Only a condition whose every `usage` read names its budget and a field other than the model's is decided:
    the model's fields reached any other way (a computed key, a macro over the fields, a value passed whole) were
    decided on 0 tokens, so a candidate that refuses every call live replayed as 'unchanged'."""
    log = _agent_log(tmp_path)
    candidate = _with_rule("token-hog", condition)
    report = replay_log(candidate, str(log))
    assert (report.decided, report.changed, report.undecidable) == (0, 0, 3), condition
    assert all("model's usage" in u.why for u in report.undecidable_examples), report.undecidable_examples


def test_a_let_bound_to_a_budgets_usage_is_read_as_that_usage(tmp_path: Path) -> None:
    log = _agent_log(tmp_path)
    candidate = _with_rule("token-hog", "u['model_' + 'tokens'] > 0",
                           RECORDED.replace("version: 1\n", "version: 1\nlet:\n  u: \"usage['model']\"\n"))
    report = replay_log(candidate, str(log))
    assert (report.decided, report.changed, report.undecidable) == (0, 0, 3)
