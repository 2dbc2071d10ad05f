"""Coverage: how a policy fares over the calls an audit log recorded.

`coverage_log(policy, source)` decides every recorded call again under `policy` — the same
walk as `proctor.policy.replay` (history, budgets, run facts rebuilt from the log; the
gate's `admit`) — and, for each call, evaluates every rule whose `match:` applies to it
(what `policy explain` traces), so it can say:

- rules that never matched any call (dead, or waiting for a case the log never saw);
- rules that matched every call they could apply to (a `when` that never says no);
- each budget's peak use, as the largest fraction of any of its limits any run (or pool)
  reached; a budget that refused a call reached 1.0 (the model's usage is not replayed: a budget
  limiting only `model_tokens` / `model_cost_usd` says so, `replayed: false`);
- tools called that the policy's `tools:` does not declare (their class came from the tool
  itself, or is destructive).

Calls the log cannot decide again (see `proctor.policy.replay`) are left out of the rule
counts and counted apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from proctor.policy.activation import Activation
from proctor.policy.admission import Admission, RunView, call_for
from proctor.policy.budgets import Ledger
from proctor.policy.conditions import EvaluationError
from proctor.policy.replay import replay_log

if TYPE_CHECKING:
    from proctor.audit.keys import PublicKeySource
    from proctor.policy.engine import Policy

__all__ = ["BudgetCoverage", "CoverageReport", "coverage_log"]

_LIMITS = (("calls", "calls", 1.0), ("cost", "cost", 1.0), ("wall_time", "wall_time_ms", 1000.0),
           ("model_tokens", "model_tokens", 1.0), ("model_cost_usd", "model_cost_usd", 1.0))


@dataclass
class BudgetCoverage:
    name: str
    max_fraction: float = 0.0
    refused: int = 0
    #: False for a budget whose every limit is on the model's usage (`model_tokens`, `model_cost_usd`): replay
    #: feeds budgets from the recorded calls, not from the model's replies, so its peak is not known.
    replayed: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "max_fraction": round(self.max_fraction, 4), "refused": self.refused,
                "replayed": self.replayed}


@dataclass
class CoverageReport:
    policy_sha256: str
    calls: int = 0
    undecidable: int = 0
    #: rule name -> [calls its match applied to, calls it matched]
    rules: dict[str, list[int]] = field(default_factory=dict)
    budgets: dict[str, BudgetCoverage] = field(default_factory=dict)
    #: tools called (and decided) that `tools:` does not declare, with how many calls each
    undeclared: dict[str, int] = field(default_factory=dict)
    #: Lines of the log that were not records, and whether its chain verified (`ReplayReport`'s, the same walk).
    bad_lines: int = 0
    log_intact: bool | None = None
    log_failure: str | None = None

    @property
    def never_matched(self) -> list[str]:
        return [name for name, (_, matched) in self.rules.items() if matched == 0]

    @property
    def always_matched(self) -> list[str]:
        return [name for name, (applied, matched) in self.rules.items() if applied and matched == applied]

    def as_dict(self) -> dict[str, Any]:
        return {"policy_sha256": self.policy_sha256, "calls": self.calls, "undecidable": self.undecidable,
                "rules": {name: {"applied": a, "matched": m} for name, (a, m) in self.rules.items()},
                "never_matched": self.never_matched, "always_matched": self.always_matched,
                "budgets": [b.as_dict() for b in self.budgets.values()],
                "undeclared_tools": sorted(self.undeclared), "bad_lines": self.bad_lines,
                "log_intact": self.log_intact, "log_failure": self.log_failure}


class _Counter:
    def __init__(self, policy: Policy, report: CoverageReport) -> None:
        self.policy = policy
        self.report = report
        self.limits = {b.name: b.limit for b in policy.budgets}

    def __call__(self, adm: Admission, run: RunView, ledger: Ledger, outcome: str, budget: str | None) -> None:
        report = self.report
        policy = self.policy
        report.calls += 1
        if adm.name not in policy.model.tools:
            report.undeclared[adm.name] = report.undeclared.get(adm.name, 0) + 1
        if adm.facts is not None:
            rules = policy.candidates(adm.name, adm.side_effect).all
            if rules:
                activation = Activation(call_for(adm, run), adm.side_effect)
                for rule in rules:
                    counts = report.rules[rule.name]
                    counts[0] += 1
                    if rule.condition is None:
                        counts[1] += 1
                        continue
                    try:
                        held = rule.condition.evaluate(activation)
                    except EvaluationError:
                        held = True  # a failing condition counts as a matching deny (as the engine decides it)
                    counts[1] += bool(held)
        if budget is not None:
            cov = report.budgets[budget]
            cov.refused += 1
            cov.max_fraction = max(cov.max_fraction, 1.0)
        if not self.limits:
            return
        for name, used in ledger.usage().items():
            limit = self.limits[name]
            cov = report.budgets[name]
            for attr, key, scale in _LIMITS:
                cap = getattr(limit, attr)
                value = used.get(key)
                if cap and isinstance(value, (int, float)):
                    fraction = value / (cap * scale)
                    if fraction > cov.max_fraction:
                        cov.max_fraction = fraction


def coverage_log(policy: Policy, source: str, *, since_ns: int | None = None, verify: bool = True,
                 pubkey: PublicKeySource | None = None) -> CoverageReport:
    """Coverage of `policy` over the audit log at `source` (a path or a ``postgresql://`` URL); with `verify`, the
    log's chain is checked first, as `replay_log` does."""
    report = CoverageReport(policy.sha256)
    report.rules = {rule.name: [0, 0] for rule in policy.compiled}
    report.budgets = {b.name: BudgetCoverage(b.name, replayed=any(
        getattr(b.limit, attr) for attr, _, _ in _LIMITS if not attr.startswith("model_"))) for b in policy.budgets}
    replayed = replay_log(policy, source, since_ns=since_ns, observe=_Counter(policy, report), verify=verify,
                          pubkey=pubkey)
    report.undecidable = replayed.undecidable
    report.bad_lines, report.log_intact, report.log_failure = (replayed.bad_lines, replayed.log_intact,
                                                               replayed.log_failure)
    return report
