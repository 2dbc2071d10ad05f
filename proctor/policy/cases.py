"""Table-driven policy tests (`proctor policy test P CASES.yaml`), as `opa test` does for Rego.

A cases file is a YAML list; each case names a call and what the gate must decide::

    - name: internal mail is allowed      # optional
      tool: send_email
      args: {to: bob@example.com}
      side_effect: external               # optional: the tool's own declaration
      history: [{tool: read_secret, side_effect: read}]   # optional: earlier calls
      run: {principal: alice, labels: {env: prod}, agent: researcher}   # optional
      usage: {run-calls: {calls: 3}}                       # optional: what budgets used so far
      expect: allow
      rules: [internal-mail]              # optional: exactly these rules decided it
      budget: run-calls                   # optional: this budget refused it (expect: deny)
      budgets: [run-calls]                # optional: exactly these budgets count it (their match, per:, window:)

Each case is decided by `proctor.policy.simulate.decide_like_gate`: with tools
(`--tools`) arguments and history are validated and completed as in a real run, and
budgets are reserved on a ledger holding `usage`. A case naming a rule or a budget
the policy does not have, or (with tools) a tool that does not exist, is an error
of the cases file, located and with a did-you-mean, not a failing case.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from proctor.calls import OUTCOMES, STATUSES, Call, CallStatus, HistoryEntry, Outcome, RunInfo, SideEffect
from proctor.errors import PolicyError, PolicyIssue
from proctor.policy.admission import facts_of
from proctor.policy.budget_trace import trace_budgets
from proctor.policy.dataflow import result_sources
from proctor.policy.engine import Policy
from proctor.policy.loader import Marks, compose_marked
from proctor.policy.simulate import Simulation, SimulationError, complete_history, decide_like_gate
from proctor.provenance import USER, ProvenanceIndex

if TYPE_CHECKING:
    from proctor.tools import Tool

__all__ = ["Case", "CaseResult", "HistoryItem", "ResultItem", "RunItem", "load_cases", "run_cases"]

_USAGE_KEYS = ("calls", "cost", "wall_time_ms", "model_tokens", "model_cost_usd")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HistoryItem(_Model):
    """An earlier call of the run, as conditions see it in `history`."""

    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    side_effect: SideEffect = "read"
    decision: Outcome = "allow"
    status: CallStatus = "ok"

    def entry(self) -> HistoryEntry:
        return HistoryEntry(self.tool, self.args, self.side_effect, self.decision, self.status)


class RunItem(_Model):
    """The run a call belongs to (`run` in conditions)."""

    id: str = "run_test"
    step: int = 0
    principal: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    #: The agent making the call (`run.agent`): a managed agent's name, or the run's own agent.
    agent: str | None = None

    def info(self) -> RunInfo:
        return RunInfo(self.id, self.step, self.principal, self.labels, self.agent)


class ResultItem(_Model):
    """What a tool returned earlier in the run, for `provenance()`: indexed under the tool's labels
    in the policy (`tool:`), or under `labels:` given here."""

    tool: str | None = None
    labels: list[str] | None = None
    value: Any = None
    #: The arguments of the call that returned it (a tool's `sources.calls` may choose its labels by them).
    args: dict[str, Any] = Field(default_factory=dict)

    def labels_in(self, policy: Policy) -> tuple[str, ...]:
        if self.labels is not None:
            return tuple(self.labels)
        if self.tool is None:
            raise SimulationError("results: give each result a tool (its labels come from the policy) or labels")
        labels = facts_of(policy, self.tool).labels
        if not labels:
            raise SimulationError(f"results: tool {self.tool!r} has no labels in the policy, so the gate would not "
                                  "index its results (give it labels, or labels: here)")
        return labels


class Case(_Model):
    """One table-driven case: a call and the outcome (and optionally rules, budget) expected."""

    name: str | None = None
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    side_effect: SideEffect | None = None
    cost: int | None = None
    history: list[HistoryItem] = Field(default_factory=list)
    run: RunItem = Field(default_factory=RunItem)
    usage: dict[str, dict[str, int | float]] = Field(default_factory=dict)
    expect: Outcome
    rules: list[str] | None = None
    budget: str | None = None
    budgets: list[str] | None = None
    #: The run's task (the source `user` of `provenance()`/`from_user()`).
    task: str | None = None
    #: Earlier results of labelled tools (the other sources of `provenance()`).
    results: list[ResultItem] = Field(default_factory=list)

    def sources(self, policy: Policy) -> ProvenanceIndex | None:
        """The run's provenance index as the gate would hold it (None when the policy reads none)."""
        if not policy.uses_provenance:
            return None
        index = ProvenanceIndex()
        if self.task:
            index.add(self.task, (USER,))
        for item in self.results:
            labels = item.labels_in(policy)
            if item.labels is None and item.tool is not None:  # by field and by call, as the gate indexes it
                index.add_result(item.value, labels, result_sources(policy, item.tool), item.args, tool=item.tool)
            else:
                index.add(item.value, labels)
        return index

    def call(self) -> Call:
        return Call(
            tool=self.tool,
            args=self.args,
            side_effect=self.side_effect,
            cost=self.cost,
            history=tuple(h.entry() for h in self.history),
            run=self.run.info(),
            usage=self.usage,
        )


@dataclass(frozen=True, slots=True)
class CaseResult:
    """A case, what the gate would decide, and whether that was what the case expected."""

    index: int
    case: Case
    simulation: Simulation
    #: The budgets that count the call (whatever their usage), in file order.
    counted_by: tuple[str, ...] = ()

    @property
    def decision(self) -> Any:
        return self.simulation.decision

    @property
    def budget(self) -> str | None:
        return self.simulation.budget

    @property
    def passed(self) -> bool:
        if self.decision.outcome != self.case.expect:
            return False
        if self.case.budget is not None and self.case.budget != self.simulation.budget:
            return False
        if self.case.budgets is not None and sorted(self.case.budgets) != sorted(self.counted_by):
            return False
        return self.case.rules is None or sorted(self.case.rules) == sorted(self.decision.rules)

    @property
    def label(self) -> str:
        return self.case.name or f"{self.case.tool} #{self.index + 1}"


_FIELDS = {
    (): list(Case.model_fields),
    ("history",): list(HistoryItem.model_fields),
    ("results",): list(ResultItem.model_fields),
    ("run",): list(RunItem.model_fields),
}
_CHOICES = {"expect": OUTCOMES, "decision": OUTCOMES, "status": STATUSES,
            "side_effect": ("none", "read", "write", "external", "destructive")}  # fmt: skip


def load_cases(
    text: str, source: str, policy: Policy | None = None, tools: Mapping[str, Tool] | None = None
) -> list[Case]:
    """Parse a cases file; raises PolicyError listing every problem with its line and column.

    Given the `policy` (and `tools`), names are checked too: every rule in `rules:`, every
    budget in `usage:` and `budget:` must exist, and every tool must be one of `tools`.
    """
    data, marks, issues = compose_marked(text, source)
    if issues:
        raise PolicyError(issues)
    if not isinstance(data, list) or not data:
        where = marks.value_at(())
        raise PolicyError(PolicyIssue(source, *where, "a cases file is a non-empty YAML list of cases"))
    try:
        cases = TypeAdapter(list[Case]).validate_python(data)
    except ValidationError as exc:
        raise PolicyError([_issue(err, data, source, marks) for err in exc.errors(include_url=False)]) from None
    if policy is not None:
        problems = _check_names(cases, policy, tools, source, marks)
        if problems:
            raise PolicyError(problems)
    return cases


def _label(index: int, case: Any) -> str:
    name = case.get("name") if isinstance(case, dict) else getattr(case, "name", None)
    return f"case {index + 1}" + (f" ({name})" if isinstance(name, str) else "")


def _unknown(kind: str, name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"the policy has: {', '.join(sorted(known)) or 'none'}"
    return f"no {kind} named '{name}' ({hint})"


def _check_names(
    cases: list[Case], policy: Policy, tools: Mapping[str, Tool] | None, source: str, marks: Marks
) -> list[PolicyIssue]:
    rules = [r.name for r in policy.rules]
    budgets = [b.name for b in policy.budgets]
    issues: list[PolicyIssue] = []

    def add(loc: tuple[Any, ...], message: str, key: bool = False) -> None:
        where = marks.keys.get(loc, marks.value_at(loc)) if key else marks.value_at(loc)
        issues.append(PolicyIssue(source, *where, f"{_label(loc[0], cases[loc[0]])}: {message}"))

    for i, case in enumerate(cases):
        for j, rule in enumerate(case.rules or ()):
            if rule not in rules:
                add((i, "rules", j), "rules: " + _unknown("rule", rule, rules))
        if case.budget is not None and case.budget not in budgets:
            add((i, "budget"), "budget: " + _unknown("budget", case.budget, budgets))
        if case.budget is not None and case.expect != "deny":
            add((i, "expect"), f"a call refused by budget '{case.budget}' is denied: write `expect: deny`")
        for name, used in case.usage.items():
            if name not in budgets:
                add((i, "usage", name), "usage: " + _unknown("budget", name, budgets), key=True)
            for key in used:
                if key not in _USAGE_KEYS:
                    close = difflib.get_close_matches(key, _USAGE_KEYS, n=1)
                    hint = f"did you mean '{close[0]}'?" if close else f"expected one of {', '.join(_USAGE_KEYS)}"
                    add((i, "usage", name, key), f"usage: unknown key '{key}' ({hint})", key=True)
        if tools is not None:
            try:
                complete_history(policy, case.call().history, tools)
            except SimulationError as exc:
                add((i, "history", exc.history_index or 0), str(exc))
    return issues


def _issue(err: Any, data: list[Any], source: str, marks: Marks) -> PolicyIssue:
    loc = tuple(err["loc"])
    index = loc[0] if loc and isinstance(loc[0], int) else 0
    item = data[index] if index < len(data) else None
    label = _label(index, item)
    path = ".".join(str(p) for p in loc[1:])
    where = marks.value_at(loc)
    if err["type"] == "extra_forbidden":
        where = marks.keys.get(loc, where)
        shape = tuple(p for p in loc[1:-1] if not isinstance(p, int))
        options = _FIELDS.get(shape, [])
        close = difflib.get_close_matches(str(loc[-1]), options, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"expected one of {', '.join(options)}"
        message = f"unknown key '{loc[-1]}'" + (f" in {path.rsplit('.', 1)[0]}" if len(loc) > 2 else "") + f" ({hint})"
    elif err["type"] == "missing":
        message = f"missing key '{loc[-1]}'"
    elif err["type"] == "literal_error" and str(loc[-1]) in _CHOICES:
        choices = _CHOICES[str(loc[-1])]
        close = difflib.get_close_matches(str(err.get("input")), choices, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"expected one of {', '.join(choices)}"
        message = f"{path}: unknown value {err.get('input')!r} ({hint})"
    else:
        message = f"{path}: {err['msg'][:1].lower()}{err['msg'][1:]}"
    return PolicyIssue(source, where[0], where[1], f"{label}: {message}")


def run_cases(
    policy: Policy, cases: Sequence[Case], tools: Mapping[str, Tool] | None = None, source: str = "<cases>"
) -> list[CaseResult]:
    """Decide every case as the gate would (see `decide_like_gate`); raises PolicyError for impossible cases."""
    results = []
    problems = []
    for i, case in enumerate(cases):
        try:
            call = case.call()
            index = case.sources(policy)
            if index is not None:
                call = replace(call, provenance=index)
            simulation = decide_like_gate(policy, call, tools, case.usage)
        except SimulationError as exc:
            problems.append(PolicyIssue(source, 0, 0, f"{_label(i, case)}: {exc}"))
            continue
        counted = tuple(t.name for t in trace_budgets(policy, simulation.call) if t.counted)
        results.append(CaseResult(i, case, simulation, counted))
    if problems:
        raise PolicyError(problems)
    return results
