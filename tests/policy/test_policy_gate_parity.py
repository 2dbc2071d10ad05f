"""`policy test --tools` decides every example case exactly as a real Gate with the real tools does."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

from proctor.approval import CallbackApprover
from proctor.calls import CallRecord
from proctor.cli import main
from proctor.gate import Gate
from proctor.policy import Policy
from proctor.policy.cases import Case, load_cases, run_cases
from proctor.tools import Tool, as_tool

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "policies"
POLICIES = sorted(p for p in EXAMPLES.glob("*.yaml") if not p.name.endswith(".cases.yaml"))


def _tools(policy: Path) -> dict[str, Tool]:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    module = importlib.import_module(f"examples.policies.{policy.stem}_tools")
    return {t.name: t for t in map(as_tool, module.TOOLS)}


def _through_gate(policy: Policy, tools: dict[str, Tool], case: Case) -> tuple[str, tuple[str, ...], str | None]:
    """Replay the case's history into a real run, then submit its call; (outcome, rules, budget) as the gate saw it."""
    asked: list[Any] = []
    gate = Gate(policy, approver=CallbackApprover(lambda request: asked.append(request) or False), tools=tools.values())
    ctx = gate.start_run(principal=case.run.principal, labels=case.run.labels, run_id=case.run.id,
                         agent=case.run.agent)
    for item in case.history:  # as the gate records a call: validated arguments, the policy's facts and labels
        tool = tools.get(item.tool)
        if tool is None:  # a call to an unknown tool is recorded as denied, without arguments
            ctx.remember(item.tool, {}, "destructive", "deny", "denied", _record(item.tool))
            continue
        facts = policy.facts(item.tool, tool.side_effect, tool.cost)
        args = tool.validate(item.args) if item.status != "denied" or item.args else {}
        ctx.remember(item.tool, args, facts.side_effect, item.decision, item.status, _record(item.tool),
                          labels=facts.labels)
    ctx.ledger.preload(case.usage)
    outcome = gate.submit(case.tool, case.args, context=ctx)
    record = outcome.record
    if record.status == "ok":
        return "allow", record.decision.rules if record.decision else (), None
    if asked:
        return "require_approval", asked[0].rules, None
    rules = record.decision.rules if record.decision else ()
    return "deny", rules if record.decision and record.decision.outcome == "deny" else (), record.budget


def _record(tool: str) -> CallRecord:
    return CallRecord("call_x", tool, {}, "read", None, "ok", 0)


@pytest.mark.parametrize("path", POLICIES, ids=[p.stem for p in POLICIES])
def test_policy_test_and_a_real_gate_agree_on_every_case(path: Path) -> None:
    """Every case: the decision of `policy test --tools` is the decision of a Gate running the real tools."""
    policy = Policy.from_yaml(path)
    tools = _tools(path)
    cases_path = path.with_suffix(".cases.yaml")
    cases = load_cases(cases_path.read_text(), str(cases_path), policy, tools)
    for result in run_cases(policy, cases, tools):
        simulated = result.decision
        rules = simulated.rules if simulated.outcome != "deny" or result.budget is None else ()
        expected = (simulated.outcome, tuple(rules), result.budget)
        got = _through_gate(policy, tools, result.case)
        if got[0] == "deny" and got[2] is not None:
            got = ("deny", (), got[2])
        assert got == expected, result.label
        assert result.passed, result.label


@pytest.mark.parametrize("path", POLICIES, ids=[p.stem for p in POLICIES])
def test_policy_test_with_tools_passes(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`proctor policy test P P.cases.yaml --tools examples.policies.P_tools` exits 0 with defaults applied."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    code = main(["policy", "test", str(path), str(path.with_suffix(".cases.yaml")),
                 "--tools", f"examples.policies.{path.stem}_tools:TOOLS"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "defaults were not applied" not in out


@pytest.mark.parametrize("path", POLICIES, ids=[p.stem for p in POLICIES])
def test_examples_lint_clean_against_their_tools(path: Path) -> None:
    """`policy check --tools` finds nothing in the examples: names, args.x and every string comparison normalised."""
    from proctor.policy.lint import lint

    assert [str(f) for f in lint(Policy.from_yaml(path), str(path), _tools(path))] == []
