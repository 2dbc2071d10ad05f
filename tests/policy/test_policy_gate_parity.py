"""`policy test --tools` decides every example case exactly as a real Gate with the real tools does.

Also with the two ways a decision is made again inside the gate: a managed agent's narrowing
layers (each case made by a managed agent whose own policy narrows the run's) and an approver's
edit (the edited arguments re-admitted through `admit`). The gate side runs the real `Gate` with
a delegated run context; the other side is `proctor.policy.simulate` (what `policy test` runs).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from proctor.approval import ApprovalDecision, ApprovalRequest, CallbackApprover
from proctor.calls import Call, CallRecord
from proctor.cli import main
from proctor.gate import Gate, RunContext
from proctor.narrowing import Layer, StackedLedger
from proctor.policy import Policy
from proctor.policy.cases import Case, load_cases, run_cases
from proctor.policy.simulate import Simulation, decide_like_gate
from proctor.tools import Tool, as_tool

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "policies"
POLICIES = sorted(p for p in EXAMPLES.glob("*.yaml") if not p.name.endswith(".cases.yaml"))


def _tools(policy: Path) -> dict[str, Tool]:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    module = importlib.import_module(f"examples.policies.{policy.stem}_tools")
    return {t.name: t for t in map(as_tool, module.TOOLS)}


Layers = Sequence[tuple[str, Policy]]
Answer = Callable[[ApprovalRequest], "bool | ApprovalDecision"]


def _through_gate(policy: Policy, tools: dict[str, Tool], case: Case, layers: Layers = (),
                  answer: Answer | None = None) -> tuple[str, tuple[str, ...], str | None]:
    """Replay the case's history into a real run, then submit its call; (outcome, rules, budget) as the gate saw it.

    With `layers`, the call is made by the last of that chain of managed agents, each with its own
    policy (delegated run contexts, as `CodeAgent` builds them)."""
    outcome, asked = _submit(policy, tools, case, layers, answer or (lambda request: False))
    record = outcome.record
    if record.status == "ok":
        return "allow", record.decision.rules if record.decision else (), None
    if asked:
        return "require_approval", asked[0].rules, None
    rules = record.decision.rules if record.decision else ()
    return "deny", rules if record.decision and record.decision.outcome == "deny" else (), record.budget


def _submit(policy: Policy, tools: dict[str, Tool], case: Case, layers: Layers, answer: Answer
            ) -> tuple[Any, list[ApprovalRequest]]:
    asked: list[ApprovalRequest] = []

    def approver(request: ApprovalRequest) -> bool | ApprovalDecision:
        asked.append(request)
        return answer(request)

    gate = Gate(policy, approver=CallbackApprover(approver), tools=tools.values())
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
    caller: RunContext = ctx
    for agent, own_policy in layers:
        own = Layer(agent, own_policy, own_policy.new_ledger(replace(caller.info, step=0, agent=agent), gate.ledger))
        caller = caller.delegate(agent, ledger=StackedLedger(caller.ledger, own.ledger, agent=agent),
                                 tools=gate.tools, layer=own, parent_call_id=f"call_{agent}")
    if layers:  # a managed agent counts its own steps from 0
        for _ in range(case.run.step):
            caller.next_step()
    return gate.submit(case.tool, case.args, context=caller), asked


def _record(tool: str) -> CallRecord:
    return CallRecord("call_x", tool, {}, "read", None, "ok", 0)


def _expected(result: Simulation) -> tuple[str, tuple[str, ...], str | None]:
    """What the gate must have done with a call `policy test` decided as `result`."""
    rules = result.decision.rules if result.decision.outcome != "deny" or result.budget is None else ()
    return result.decision.outcome, tuple(rules), result.budget


def _normal(got: tuple[str, tuple[str, ...], str | None]) -> tuple[str, tuple[str, ...], str | None]:
    return ("deny", (), got[2]) if got[0] == "deny" and got[2] is not None else got


def _cases(path: Path) -> tuple[Policy, dict[str, Tool], list[Case]]:
    policy = Policy.from_yaml(path)
    tools = _tools(path)
    cases_path = path.with_suffix(".cases.yaml")
    return policy, tools, load_cases(cases_path.read_text(), str(cases_path), policy, tools)


def _layers(path: Path, policy: Policy, tools: dict[str, Tool]) -> dict[str, Policy]:
    """Managed agents' own policies to narrow each example's run policy with.

    - ask: asks a human for every call but pure computations (require_approval over the run's allow);
    - costly: makes every tool cost 3 and denies destructive calls, with a budget of its own that
      a call costing 3 passes only if it is not external (facts narrowed into the run's budgets);
    - self: the example policy again as its own layer (its rules named ``agent:rule``, its budgets
      counted twice);
    - the example's own managed-agent policy where it ships one (research → researcher).
    """
    layers = {
        "ask": Policy.from_dict({"version": 1, "default": "allow", "rules": [
            {"name": "ask-all", "match": {"side_effect": ["read", "write", "external", "destructive"]},
             "decision": "require_approval", "reason": "its own policy asks for every call that reads or acts"}]}),
        "costly": Policy.from_dict({
            "version": 1, "default": "allow", "tools": {name: {"cost": 3} for name in sorted(tools)},
            "budgets": [{"name": "own-outbound", "match": {"side_effect": "external"}, "limit": {"cost": 2}}],
            "rules": [{"name": "no-destructive", "match": {"side_effect": "destructive"}, "decision": "deny"}]}),
        "self": policy,
    }
    own = EXAMPLES / f"{path.stem}er.yaml"
    if own.exists():
        layers[own.stem] = Policy.from_yaml(own)
    return layers


def _edits(case: Case, cases: Sequence[Case]) -> list[dict[str, Any]]:
    """Arguments an approver may write instead of the case's: its own, and every other case's for its tool."""
    edits = [dict(case.args)]
    for other in cases:
        if other.tool == case.tool and dict(other.args) not in edits:
            edits.append(dict(other.args))
    return edits


def _simulate(policy: Policy, tools: dict[str, Tool], case: Case, layers: Layers,
              args: dict[str, Any] | None = None) -> Simulation:
    """`policy test`'s decision of the case's call (with `args` instead of its own), made by the last layer's agent."""
    call: Call = case.call()
    if args is not None:
        call = replace(call, args=args)
    index = case.sources(policy)
    if index is not None:
        call = replace(call, provenance=index)
    return decide_like_gate(policy, call, tools, case.usage, layers=layers)


def _layered(case: Case, agent: str) -> Case:
    """The case as a call of managed agent `agent` (keeping the agent the case names, which its rules may test)."""
    return case.model_copy(update={"run": case.run.model_copy(update={"agent": case.run.agent or agent})})


@pytest.mark.parametrize("path", POLICIES, ids=[p.stem for p in POLICIES])
def test_policy_test_and_a_real_gate_agree_on_every_case(path: Path) -> None:
    """Every case: the decision of `policy test --tools` is the decision of a Gate running the real tools."""
    policy, tools, cases = _cases(path)
    for result in run_cases(policy, cases, tools):
        assert _normal(_through_gate(policy, tools, result.case)) == _expected(result.simulation), result.label
        assert result.passed, result.label


@pytest.mark.parametrize("path", POLICIES, ids=[p.stem for p in POLICIES])
def test_a_managed_agents_layer_narrows_alike_in_policy_test_and_a_real_gate(path: Path) -> None:
    """Every case, made by a managed agent under each layer: the gate's decision is `policy test`'s."""
    policy, tools, cases = _cases(path)
    narrowed = 0
    for name, own in _layers(path, policy, tools).items():
        for i, plain in enumerate(cases):
            case = _layered(plain, name)
            layers = [(case.run.agent or name, own)]
            expected = _expected(_simulate(policy, tools, case, layers))
            assert _normal(_through_gate(policy, tools, case, layers)) == expected, f"{path.stem} #{i} under {name}"
            unlayered = _expected(_simulate(policy, tools, case, ()))
            narrowed += expected != unlayered
            # A layer only takes away: never a milder outcome than the run's policy alone.
            rank = {"allow": 0, "require_approval": 1, "deny": 2}
            assert rank[expected[0]] >= rank[unlayered[0]], f"{path.stem} #{i} under {name}"
    assert narrowed, f"no layer changed any decision of {path.stem}'s cases: the layers test nothing there"


@pytest.mark.parametrize("path", POLICIES, ids=[p.stem for p in POLICIES])
def test_two_nested_layers_narrow_alike_in_policy_test_and_a_real_gate(path: Path) -> None:
    """A managed agent of a managed agent: both layers narrow, in the gate as in `policy test`."""
    policy, tools, cases = _cases(path)
    available = _layers(path, policy, tools)
    layers = [("outer", available["costly"]), ("inner", available["ask"])]
    for i, case in enumerate(cases):
        chain = [layers[0], (case.run.agent or "inner", layers[1][1])]
        expected = _expected(_simulate(policy, tools, _layered(case, "inner"), chain))
        assert _normal(_through_gate(policy, tools, _layered(case, "inner"), chain)) == expected, f"{path.stem} #{i}"


@pytest.mark.parametrize("path", POLICIES, ids=[p.stem for p in POLICIES])
@pytest.mark.parametrize("layered", [False, True], ids=["run", "managed"])
def test_an_approvers_edit_is_decided_alike_in_policy_test_and_a_real_gate(path: Path, layered: bool) -> None:
    """Every case the gate sends to a human, answered with an edit to each other case's arguments for its tool:
    the edited call runs exactly when `policy test` does not deny those arguments, decided by the same rules."""
    policy, tools, cases = _cases(path)
    chains: list[Layers] = [()]
    if layered:
        chains = [[(name, own)] for name, own in _layers(path, policy, tools).items()]
    edited = 0
    for base in chains:
        for i, plain in enumerate(cases):
            case = _layered(plain, base[0][0]) if base else plain
            chain = [(case.run.agent or agent, own) for agent, own in base]
            if _expected(_simulate(policy, tools, case, chain))[0] != "require_approval":
                continue
            for args in _edits(case, cases):
                label = f"{path.stem} #{i} edited to {args}" + (f" under {chain[0][0]}" if chain else "")

                def edit(request: ApprovalRequest, args: dict[str, Any] = args) -> ApprovalDecision:
                    return ApprovalDecision("edit", request.binding, "editor", "edited", args=args)

                outcome, asked = _submit(policy, tools, case, chain, edit)
                assert asked, label
                simulated = _simulate(policy, tools, case, chain, args)
                record = outcome.record
                if simulated.decision.outcome == "deny":
                    assert record.status == "denied", label
                    assert outcome.error is not None and "edited arguments" in str(outcome.error), label
                    if simulated.budget is None and simulated.decision.rules:
                        assert tuple(outcome.error.rules) == simulated.decision.rules, label
                else:  # the edit is the human's approval: the edited call runs, decided as policy test decides it
                    assert record.status == "ok", (label, record.error)
                    assert record.decision is not None, label
                    assert (record.decision.outcome, record.decision.rules) == (
                        simulated.decision.outcome, simulated.decision.rules), label
                edited += 1
    if any(_expected(_simulate(policy, tools, c, ()))[0] == "require_approval" for c in cases) or layered:
        assert edited, f"no case of {path.stem} went to a human: no edit was tested"


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
