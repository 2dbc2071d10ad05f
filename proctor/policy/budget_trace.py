"""Which budgets count a call, in which pool, and whether they would refuse it (for explain and tests).

The gate's ledger does the counting; this only reads the policy and a `usage` snapshot
(as `policy explain --usage` and a cases file's `usage:` give it), so people can see a
budget's scope and window before anything runs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proctor.calls import Call
from proctor.policy.admission import facts_of
from proctor.policy.engine import Policy
from proctor.policy.matching import Matcher

if TYPE_CHECKING:
    from proctor.policy.schema import BudgetSpec

__all__ = ["BudgetTrace", "describe_budget", "trace_budgets"]


@dataclass(frozen=True, slots=True)
class BudgetTrace:
    """One budget's part in a call: does it count the call, in which pool, would it refuse it."""

    name: str
    counted: bool
    scope: str  # "per principal alice, window 24h (from 2026-11-30T00:00:00Z)"
    pool: str | None  # the shared pool's key, for principal/label/global budgets that count the call
    refusal: str | None  # why the call would be refused given the usage, else None


def _limits(spec: BudgetSpec) -> str:
    parts = []
    for kind, value in spec.limit.model_dump().items():
        if value is not None:
            parts.append(f"{kind} {value:g}s" if kind == "wall_time" else f"{kind} {value:g}")
    return ", ".join(parts)


def describe_budget(spec: BudgetSpec) -> str:
    """One line: limits, scope, window and match (`policy check` prints one per budget)."""
    scope = {"run": "per run", "step": "per step", "principal": "per principal", "global": "global"}.get(
        spec.per, f"per value of label {spec.label_key}")
    window = f", every {spec.window:g}s (fixed windows)" if spec.window is not None else ""
    match = ""
    if spec.match is not None:
        bits = []
        if spec.match.tool:
            bits.append("tool " + "|".join(spec.match.tool))
        if spec.match.side_effect:
            bits.append("side_effect " + "|".join(spec.match.side_effect))
        match = f", for {' and '.join(bits)}"
    return f"budget {spec.name}: {_limits(spec)}, {scope}{window}{match}"


def _scope(spec: BudgetSpec, call: Call, now_s: float) -> str:
    if spec.per == "principal":
        who = f"per principal {call.run.principal or '(none)'}"
    elif spec.label_key is not None:
        who = f"per label {spec.label_key}={call.run.labels.get(spec.label_key, '(none)')}"
    else:
        who = {"run": "per run", "step": "per step"}.get(spec.per, "global")
    if spec.window is None:
        return who
    from proctor.policy.budgets import window_start  # here: `policy check` describes budgets without it

    start = window_start(spec, now_s)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))
    return f"{who}, window {spec.window:g}s (from {stamp})"


def _refusal(spec: BudgetSpec, used: Mapping[str, Any], cost: float) -> str | None:
    limit = spec.limit
    calls, spent = int(used.get("calls", 0) or 0), float(used.get("cost", 0) or 0)
    if limit.calls is not None and calls + 1 > limit.calls:
        return f"{calls} of {limit.calls} calls used"
    if limit.cost is not None and spent + cost > limit.cost:
        return f"cost {spent:g} used + {cost:g} would pass the limit of {limit.cost:g}"
    wall_ms = used.get("wall_time_ms")
    if limit.wall_time is not None and wall_ms is not None and wall_ms >= limit.wall_time * 1000:
        return f"wall time {wall_ms / 1000:.1f}s of {limit.wall_time:g}s used"
    return None


def trace_budgets(policy: Policy, call: Call, *, now_s: float | None = None) -> tuple[BudgetTrace, ...]:
    """Every budget of `policy`, in file order, against `call` and its `usage`."""
    from proctor.policy.budgets import pool_key

    now_s = time.time() if now_s is None else now_s
    facts = facts_of(policy, call.tool, call.side_effect, call.cost or 0)
    out = []
    for spec in policy.budgets:
        counted = Matcher.from_spec(spec.match).matches(call.tool, facts.side_effect)
        used = call.usage.get(spec.name) if isinstance(call.usage, Mapping) else None
        refusal = _refusal(spec, used, facts.cost) if counted and isinstance(used, Mapping) else None
        out.append(BudgetTrace(
            spec.name, counted, _scope(spec, call, now_s),
            pool_key(spec, call.run, now_s) if counted and spec.shared else None,
            f"budget '{spec.name}' exhausted: {refusal}" if refusal else None,
        ))
    return tuple(out)
