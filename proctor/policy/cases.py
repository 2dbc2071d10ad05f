"""Table-driven policy tests (`proctor policy test P CASES.yaml`), as `opa test` does for Rego.

A cases file is a YAML list; each case names a call and what the policy must decide::

    - name: internal mail is allowed      # optional
      tool: send_email
      args: {to: bob@example.com}
      side_effect: external               # optional: the tool's own declaration
      history: [{tool: read_secret, side_effect: read}]   # optional: earlier calls
      run: {principal: alice, labels: {env: prod}}        # optional
      usage: {run-calls: {calls: 3}}                       # optional
      expect: allow
      rules: [internal-mail]              # optional: exactly these rules decided it
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from proctor.calls import Call, CallStatus, Decision, HistoryEntry, Outcome, RunInfo, SideEffect
from proctor.errors import PolicyError, PolicyIssue
from proctor.policy.engine import Policy
from proctor.policy.loader import Marks, compose_marked

__all__ = ["Case", "CaseResult", "HistoryItem", "RunItem", "load_cases", "run_cases"]


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

    def info(self) -> RunInfo:
        return RunInfo(self.id, self.step, self.principal, self.labels)


class Case(_Model):
    """One table-driven case: a call and the outcome (and optionally rules) expected."""

    name: str | None = None
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    side_effect: SideEffect | None = None
    cost: int | None = None
    history: list[HistoryItem] = Field(default_factory=list)
    run: RunItem = Field(default_factory=RunItem)
    usage: dict[str, dict[str, Any]] = Field(default_factory=dict)
    expect: Outcome
    rules: list[str] | None = None

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
    """A case, what the policy decided, and whether that was what the case expected."""

    index: int
    case: Case
    decision: Decision

    @property
    def passed(self) -> bool:
        if self.decision.outcome != self.case.expect:
            return False
        return self.case.rules is None or sorted(self.case.rules) == sorted(self.decision.rules)

    @property
    def label(self) -> str:
        return self.case.name or f"{self.case.tool} #{self.index + 1}"


def load_cases(text: str, source: str) -> list[Case]:
    """Parse a cases file; raises PolicyError listing every problem with its line and column."""
    data, marks, issues = compose_marked(text, source)
    if issues:
        raise PolicyError(issues)
    if not isinstance(data, list) or not data:
        where = marks.value_at(())
        raise PolicyError(PolicyIssue(source, *where, "a cases file is a non-empty YAML list of cases"))
    try:
        return TypeAdapter(list[Case]).validate_python(data)
    except ValidationError as exc:
        raise PolicyError([_issue(err, data, source, marks) for err in exc.errors(include_url=False)]) from None


def _issue(err: Any, data: list[Any], source: str, marks: Marks) -> PolicyIssue:
    loc = tuple(err["loc"])
    index = loc[0] if loc and isinstance(loc[0], int) else 0
    item = data[index] if index < len(data) else None
    name = item.get("name") if isinstance(item, dict) else None
    label = f"case {index + 1}" + (f" ({name})" if isinstance(name, str) else "")
    path = ".".join(str(p) for p in loc[1:])
    if err["type"] == "extra_forbidden":
        where = marks.keys.get(loc, marks.value_at(loc))
        message = f"unknown key '{loc[-1]}' (expected one of {', '.join(Case.model_fields)})"
    elif err["type"] == "missing":
        where, message = marks.value_at(loc), f"missing key '{loc[-1]}'"
    else:
        where, message = marks.value_at(loc), f"{path}: {err['msg'][:1].lower()}{err['msg'][1:]}"
    return PolicyIssue(source, where[0], where[1], f"{label}: {message}")


def run_cases(policy: Policy, cases: Sequence[Case]) -> list[CaseResult]:
    """Decide every case with `policy`."""
    return [CaseResult(i, case, policy.decide(case.call())) for i, case in enumerate(cases)]
