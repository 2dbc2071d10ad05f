"""Budget ledgers: what one run may still spend, reserved before each call.

A `Ledger` belongs to one run. `reserve` counts the call and its declared cost at
once, under one lock, so concurrent callers can never overshoot a limit together;
`settle` records the call's duration (and replaces the reserved cost by the actual
one when given); `release` gives back a call that did not run.

Limits:
- ``calls``: a call is refused when it would be call number ``calls + 1``.
- ``cost``: refused when the cost used plus this call's cost would pass the limit.
- ``wall_time``: for a budget *without* ``match``, the time elapsed since the run
  (or, for ``per: step``, the step) started; for a scoped budget, the summed duration
  of its matching calls settled so far. A call is refused once the limit is reached.
- ``model_tokens`` / ``model_cost_usd``: charged by the agent after each model reply
  (`charge_model`) and checked between steps (`check_model`, which raises once the
  usage has reached the limit). Only budgets without ``match`` may carry them.

``per: step`` budgets start afresh at each `next_step`; a reservation made in an
earlier step no longer touches them when it is settled or released.
A reservation is settled or released once; later calls for it are ignored.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proctor.errors import BudgetExceeded
from proctor.policy.matching import Matcher
from proctor.policy.schema import BudgetSpec

__all__ = ["Ledger", "Reservation"]

_MATCH_CACHE = 4096


@dataclass(frozen=True, slots=True)
class Reservation:
    """A call counted against the budgets it matches, awaiting `settle` or `release`."""

    id: int
    tool: str
    side_effect: str
    cost: float
    budgets: tuple[str, ...]
    step: int


#: The reservation of a call no budget counts: it holds nothing, so one serves them all.
_UNCOUNTED = Reservation(0, "", "", 0, (), 0)


@dataclass(slots=True)
class _Used:
    calls: int = 0
    cost: float = 0
    wall_ns: int = 0
    model_tokens: int = 0
    model_cost_usd: float = 0.0


@dataclass(frozen=True, slots=True)
class _Budget:
    spec: BudgetSpec
    matcher: Matcher

    @property
    def name(self) -> str:
        return self.spec.name


def _num(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


class Ledger:
    """Thread-safe per-run budget accounting (see the module docstring for semantics)."""

    def __init__(self, budgets: Sequence[BudgetSpec], *, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._budgets = tuple(_Budget(b, Matcher.from_spec(b.match)) for b in budgets)
        self._by_name = {b.name: b for b in self._budgets}
        self._clock = clock
        self._lock = threading.Lock()
        self._used = {b.name: _Used() for b in self._budgets}
        self._open: dict[int, Reservation] = {}
        self._ids = itertools.count(1)
        self._step = 0
        self._started_ns = self._step_started_ns = clock()
        self._matching: dict[tuple[str, str], tuple[_Budget, ...]] = {}

    def _budgets_for(self, tool: str, side_effect: str) -> tuple[_Budget, ...]:
        key = (tool, side_effect)
        found = self._matching.get(key)
        if found is None:
            if len(self._matching) >= _MATCH_CACHE:
                self._matching.clear()
            found = tuple(b for b in self._budgets if b.matcher.matches(tool, side_effect))
            self._matching[key] = found
        return found

    def _wall_ns(self, budget: _Budget, now: int) -> int:
        if budget.spec.match is None:
            return now - (self._step_started_ns if budget.spec.per == "step" else self._started_ns)
        return self._used[budget.name].wall_ns

    def reserve(self, tool: str, side_effect: str, cost: float) -> Reservation:
        """Count one call of `tool` against every budget it matches, or raise BudgetExceeded."""
        cost = cost or 0  # a tool may declare no cost
        if self._matching.get((tool, side_effect)) == ():
            # Counted by no budget (a policy without budgets, a read no budget matches): there is
            # nothing to check, hold or give back, so no lock and no open reservation.
            return _UNCOUNTED
        with self._lock:
            matching = self._budgets_for(tool, side_effect)
            if not matching:
                return _UNCOUNTED
            now = self._clock()
            for budget in matching:
                used, limit = self._used[budget.name], budget.spec.limit
                problem = None
                if limit.calls is not None and used.calls + 1 > limit.calls:
                    problem = f"{used.calls} of {limit.calls} calls used"
                elif limit.cost is not None and used.cost + cost > limit.cost:
                    problem = f"cost {_num(used.cost)} used + {_num(cost)} would pass the limit of {_num(limit.cost)}"
                elif limit.wall_time is not None and self._wall_ns(budget, now) >= limit.wall_time * 1e9:
                    problem = f"wall time {self._wall_ns(budget, now) / 1e9:.1f}s of {limit.wall_time:g}s used"
                if problem:
                    per = " this step" if budget.spec.per == "step" else ""
                    raise BudgetExceeded(f"{tool}: budget '{budget.name}' exhausted{per}: {problem}", tool=tool,
                                         budget=budget.name)  # fmt: skip
            for budget in matching:
                used = self._used[budget.name]
                used.calls += 1
                used.cost += cost
            reservation = Reservation(
                next(self._ids), tool, side_effect, cost, tuple(b.name for b in matching), self._step
            )
            self._open[reservation.id] = reservation
            return reservation

    def _live(self, reservation: Reservation) -> list[_Used]:
        """The usage records a reservation still affects (per-step budgets only in its own step)."""
        return [
            self._used[name]
            for name in reservation.budgets
            if self._by_name[name].spec.per == "run" or reservation.step == self._step
        ]

    def settle(self, reservation: Reservation, *, duration_ns: int, cost: float | None = None) -> None:
        """The call ran for `duration_ns`; `cost`, when given, replaces the reserved cost."""
        if not reservation.budgets:
            return
        with self._lock:
            if self._open.pop(reservation.id, None) is None:
                return
            for used in self._live(reservation):
                used.wall_ns += max(0, int(duration_ns))
                if cost is not None:
                    used.cost += cost - reservation.cost

    def release(self, reservation: Reservation) -> None:
        """The call did not run: give back its call and its cost."""
        if not reservation.budgets:
            return
        with self._lock:
            if self._open.pop(reservation.id, None) is None:
                return
            for used in self._live(reservation):
                used.calls -= 1
                used.cost -= reservation.cost

    def charge_model(self, tokens: int, cost_usd: float) -> None:
        """Record what a model reply used (counted by every budget without `match`)."""
        with self._lock:
            for budget in self._budgets:
                if budget.spec.match is None:
                    used = self._used[budget.name]
                    used.model_tokens += tokens
                    used.model_cost_usd += cost_usd

    def check_model(self) -> None:
        """Raise BudgetExceeded when a model_tokens or model_cost_usd limit has been reached."""
        with self._lock:
            for budget in self._budgets:
                used, limit = self._used[budget.name], budget.spec.limit
                if limit.model_tokens is not None and used.model_tokens >= limit.model_tokens:
                    problem = f"{used.model_tokens} of {limit.model_tokens} model tokens used"
                elif limit.model_cost_usd is not None and used.model_cost_usd >= limit.model_cost_usd:
                    problem = f"${used.model_cost_usd:.4f} of ${limit.model_cost_usd:g} model cost used"
                else:
                    continue
                raise BudgetExceeded(f"budget '{budget.name}' exhausted: {problem}", budget=budget.name)

    def preload(self, usage: Mapping[str, Mapping[str, float]]) -> None:
        """Start from recorded usage (`policy test` cases, `explain --usage`): ``{budget: {calls, cost, …}}``.

        Keys are those of `usage()`; ``wall_time_ms`` of a budget without ``match`` moves the
        run's (or step's) start back by that much. An unknown budget or key is a ValueError.
        """
        fields = ("calls", "cost", "wall_time_ms", "model_tokens", "model_cost_usd")
        with self._lock:
            for name, used in usage.items():
                budget = self._by_name.get(name)
                if budget is None:
                    raise ValueError(f"no budget named {name!r} (budgets: {', '.join(self._by_name) or 'none'})")
                record = self._used[name]
                for key, value in used.items():
                    if key not in fields:
                        raise ValueError(f"budget {name!r}: unknown usage {key!r} (expected {', '.join(fields)})")
                    if key == "wall_time_ms":
                        if budget.spec.match is None:
                            shift = int(value * 1_000_000)
                            if budget.spec.per == "step":
                                self._step_started_ns = min(self._step_started_ns, self._clock() - shift)
                            else:
                                self._started_ns = min(self._started_ns, self._clock() - shift)
                        else:
                            record.wall_ns = int(value * 1_000_000)
                    elif key in ("calls", "model_tokens"):
                        setattr(record, key, int(value))
                    else:
                        setattr(record, key, value)

    def next_step(self) -> None:
        """Start a new step: `per: step` budgets start from zero."""
        with self._lock:
            self._step += 1
            self._step_started_ns = self._clock()
            for budget in self._budgets:
                if budget.spec.per == "step":
                    self._used[budget.name] = _Used()

    def snapshot(self) -> dict[str, Any]:
        """What a durable run saves to restore this ledger elsewhere: usage per budget, time elapsed, the step."""
        with self._lock:
            now = self._clock()
            return {
                "used": {name: [u.calls, u.cost, u.wall_ns, u.model_tokens, u.model_cost_usd]
                         for name, u in self._used.items()},
                "elapsed_ns": now - self._started_ns, "step_elapsed_ns": now - self._step_started_ns,
                "step": self._step,
            }

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Continue from `snapshot()`: budgets this policy no longer has are dropped, new ones start at zero.
        Time spent suspended does not count against wall-time budgets."""
        with self._lock:
            now = self._clock()
            for name, values in dict(snapshot.get("used") or {}).items():
                if name in self._used:
                    calls, cost, wall_ns, tokens, usd = values
                    self._used[name] = _Used(int(calls), cost, int(wall_ns), int(tokens), float(usd))
            self._started_ns = now - int(snapshot.get("elapsed_ns", 0))
            self._step_started_ns = now - int(snapshot.get("step_elapsed_ns", 0))
            self._step = int(snapshot.get("step", self._step))

    def usage(self) -> dict[str, dict[str, Any]]:
        """What each budget has used: calls, cost, wall_time_ms, model_tokens, model_cost_usd."""
        with self._lock:
            now = self._clock()
            return {
                b.name: {
                    "calls": self._used[b.name].calls,
                    "cost": _num(self._used[b.name].cost),
                    "wall_time_ms": self._wall_ns(b, now) // 1_000_000,
                    "model_tokens": self._used[b.name].model_tokens,
                    "model_cost_usd": self._used[b.name].model_cost_usd,
                }
                for b in self._budgets
            }

    def remaining(self) -> dict[str, dict[str, Any]]:
        """What each budget may still use, for the limits it sets (never below zero)."""
        used_now = self.usage()
        out: dict[str, dict[str, Any]] = {}
        for b in self._budgets:
            limit, used = b.spec.limit, used_now[b.name]
            left: dict[str, Any] = {}
            if limit.calls is not None:
                left["calls"] = max(0, limit.calls - used["calls"])
            if limit.cost is not None:
                left["cost"] = _num(max(0.0, limit.cost - used["cost"]))
            if limit.wall_time is not None:
                left["wall_time_ms"] = max(0, int(limit.wall_time * 1000) - used["wall_time_ms"])
            if limit.model_tokens is not None:
                left["model_tokens"] = max(0, limit.model_tokens - used["model_tokens"])
            if limit.model_cost_usd is not None:
                left["model_cost_usd"] = max(0.0, limit.model_cost_usd - used["model_cost_usd"])
            out[b.name] = left
        return out
