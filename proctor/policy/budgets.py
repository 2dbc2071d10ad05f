"""Budget ledgers: what one run may still spend, reserved before each call.

A `Ledger` belongs to one run. `reserve` counts the call and its declared cost at
once, under one lock, so concurrent callers can never overshoot a limit together;
`settle` records the call's duration (and replaces the reserved cost by the actual
one when given); `release` gives back a call that did not run.

Limits:
- ``calls``: a call is refused when it would be call number ``calls + 1``.
- ``cost``: refused when the cost used plus this call's cost would pass the limit.
- ``wall_time``: for a run budget *without* ``match``, the time elapsed since the run
  (or, for ``per: step``, the step) started; for a scoped or shared budget, the summed
  duration of its counted calls settled so far. A call is refused once the limit is reached.
- ``model_tokens`` / ``model_cost_usd``: charged by the agent after each model reply
  (`charge_model`) and checked between steps (`check_model`, which raises once the
  usage has reached the limit). Only budgets without ``match`` may carry them.

Scopes (``per:``): ``run`` (the default) and ``step`` are counted here; ``step`` budgets
start afresh at each `next_step`, and a reservation made in an earlier step no longer
touches them when it is settled or released. ``principal``, ``label:KEY`` and ``global``
budgets are pools shared between runs, held by a `proctor.ledger.SharedLedger` (the
process's in-memory one, or Redis for a fleet): one pool per principal, per value of the
run's label KEY (runs without the label share the pool of the empty value), or one for all.
``window:`` makes a budget start afresh at each fixed window aligned on the Unix epoch;
a reservation is settled or released in the window it was made in.
A reservation is settled or released once; later calls for it are ignored.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proctor.calls import BudgetHold, RunInfo
from proctor.errors import BudgetExceeded, LedgerUnavailable
from proctor.ledger.base import Claim, Lease, PoolUsage, SharedLedger
from proctor.ledger.memory import MemoryLedger
from proctor.ledger.opening import default_ledger
from proctor.policy.matching import Matcher

if TYPE_CHECKING:
    from proctor.policy.schema import BudgetSpec

__all__ = ["UNCOUNTED", "Ledger", "Reservation", "pool_key", "window_start"]

_MATCH_CACHE = 4096
#: How long a windowed shared pool is kept past its window (a margin for clock skew and late settles).
_WINDOW_MARGIN_S = 3600


@dataclass(frozen=True, slots=True)
class Reservation(BudgetHold):
    """A call counted against the budgets it matches, awaiting `settle` or `release`."""

    id: int
    tool: str
    side_effect: str
    cost: float
    budgets: tuple[str, ...]
    step: int
    #: (budget, window start) of each local windowed budget counted, so a late settle stays in its window.
    windows: tuple[tuple[str, int], ...] = ()
    lease: Lease | None = None


#: The reservation of a call no budget counts: it holds nothing, so one serves them all.
UNCOUNTED = Reservation(0, "", "", 0, (), 0)


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


@dataclass(frozen=True, slots=True)
class _Plan:
    """How a call of one (tool, class) is counted: the budgets it matches, and whether counting it needs
    the clocks or the shared ledger (most calls' do not: then `reserve` reads neither)."""

    matching: tuple[_Budget, ...]
    names: tuple[str, ...]
    #: (budget, its name, its limit's calls, its limit's cost) of each budget held here (not shared).
    local: tuple[tuple[_Budget, str, int | None, float | None], ...]
    #: Whether a local budget is windowed or limits wall time (the clocks are read), or one is shared.
    timed: bool
    shared: bool

    @classmethod
    def of(cls, matching: tuple[_Budget, ...]) -> _Plan:
        local = tuple((b, b.name, b.spec.limit.calls, b.spec.limit.cost) for b in matching if not b.spec.shared)
        timed = any(b.spec.window is not None or b.spec.limit.wall_time is not None for b, *_ in local)
        return cls(matching, tuple(b.name for b in matching), local, timed, len(local) != len(matching))


def _num(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def window_start(spec: BudgetSpec, now_s: float) -> int:
    """The start (Unix seconds) of the fixed window `now_s` falls in; 0 for a budget without window."""
    if spec.window is None:
        return 0
    return int(now_s // spec.window * spec.window)


def _scope_value(spec: BudgetSpec, run: RunInfo) -> str:
    if spec.per == "principal":
        return f"principal={run.principal or ''}"
    key = spec.label_key
    if key is not None:
        return f"label:{key}={run.labels.get(key, '')}"
    return "global"


def pool_key(spec: BudgetSpec, run: RunInfo, now_s: float) -> str:
    """The shared pool a call of `run` counts against for budget `spec` at time `now_s`."""
    return f"{spec.name}|{_scope_value(spec, run)}|w={window_start(spec, now_s)}"


def _describe(spec: BudgetSpec, run: RunInfo) -> str:
    if spec.per == "principal":
        who = f"principal {run.principal}" if run.principal else "runs without a principal"
    elif spec.label_key is not None:
        value = run.labels.get(spec.label_key)
        who = f"label {spec.label_key}={value}" if value is not None else f"runs without label {spec.label_key}"
    else:
        who = "all runs"
    window = f", window {spec.window:g}s" if spec.window is not None else ""
    return f"for {who}{window}"


class Ledger:
    """Thread-safe per-run budget accounting (see the module docstring for semantics)."""

    def __init__(
        self,
        budgets: Sequence[BudgetSpec],
        *,
        clock: Callable[[], int] = time.monotonic_ns,
        run: RunInfo | None = None,
        shared: SharedLedger | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._budgets = tuple(_Budget(b, Matcher.from_spec(b.match)) for b in budgets)
        self._by_name = {b.name: b for b in self._budgets}
        self._clock = clock
        self._wall = wall_clock
        self._run = run or RunInfo(id="run")
        self._shared_ledger = shared
        self._lock = threading.Lock()
        self._used = {b.name: _Used() for b in self._budgets if not b.spec.shared}
        self._window: dict[str, int] = {}  # local windowed budget -> the window its usage belongs to
        self._open: dict[int, Reservation] = {}
        self._ids = itertools.count(1)
        self._step = 0
        self._started_ns = self._step_started_ns = clock()
        self._matching: dict[tuple[str, str], tuple[_Budget, ...]] = {}
        self._plans: dict[tuple[str, str], _Plan] = {}

    @property
    def shared(self) -> SharedLedger:
        """The ledger holding this run's shared budgets (the process default unless given)."""
        if self._shared_ledger is None:
            self._shared_ledger = default_ledger()
        return self._shared_ledger

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

    def _roll(self, budget: _Budget, now_s: float) -> int:
        """Start a local windowed budget afresh when its window has passed; return the current window."""
        start = window_start(budget.spec, now_s)
        if self._window.get(budget.name, start) != start:
            self._used[budget.name] = _Used()
        self._window[budget.name] = start
        return start

    def _claim(self, budget: _Budget, now_s: float) -> Claim:
        spec, limit = budget.spec, budget.spec.limit
        return Claim(
            key=pool_key(spec, self._run, now_s),
            budget=spec.name,
            calls=limit.calls,
            cost=limit.cost,
            wall_ns=int(limit.wall_time * 1e9) if limit.wall_time is not None else None,
            ttl_s=int(spec.window) + _WINDOW_MARGIN_S if spec.window is not None else None,
            scope=_describe(spec, self._run),
        )

    def _plan_for(self, tool: str, side_effect: str) -> _Plan:
        key = (tool, side_effect)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= _MATCH_CACHE:
                self._plans.clear()
            plan = self._plans[key] = _Plan.of(self._budgets_for(tool, side_effect))
        return plan

    def reserve(self, tool: str, side_effect: str, cost: float) -> Reservation:
        """Count one call of `tool` against every budget it matches, or raise BudgetExceeded."""
        cost = cost or 0  # a tool may declare no cost
        plan = self._plans.get((tool, side_effect)) or self._plan_for(tool, side_effect)
        if not plan.matching:
            # Counted by no budget (a policy without budgets, a read no budget matches): there is
            # nothing to check, hold or give back, so no lock and no open reservation.
            return UNCOUNTED
        if not plan.timed and not plan.shared:
            return self._reserve_counted(plan, tool, side_effect, cost)
        with self._lock:
            matching = plan.matching
            now = self._clock()
            now_s = self._wall()
            local = [b for b in matching if not b.spec.shared]
            windows = tuple((b.name, self._roll(b, now_s)) for b in local if b.spec.window is not None)
            for budget in local:
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
                    if budget.spec.window is not None:
                        per = f" this window ({budget.spec.window:g}s)"
                    raise BudgetExceeded(f"{tool}: budget '{budget.name}' exhausted{per}: {problem}", tool=tool,
                                         budget=budget.name)  # fmt: skip
            for budget in local:
                used = self._used[budget.name]
                used.calls += 1
                used.cost += cost
            reservation = Reservation(
                next(self._ids), tool, side_effect, cost, tuple(b.name for b in matching), self._step, windows
            )
            claims = [self._claim(b, now_s) for b in matching if b.spec.shared]
            if not claims:
                self._open[reservation.id] = reservation
                return reservation
        # Shared pools: one call to the shared ledger, outside the run's lock (it may cross a network).
        try:
            lease = self.shared.reserve(claims, cost, tool=tool)
        except BaseException as exc:
            with self._lock:
                for used in self._live(reservation):
                    used.calls -= 1
                    used.cost -= reservation.cost
            if isinstance(exc, BudgetExceeded):
                raise
            if isinstance(exc, Exception):
                raise LedgerUnavailable(f"{tool}: refused: the budget ledger {self.shared.url} failed: {exc!r}",
                                        tool=tool, budget=claims[0].budget) from exc  # fmt: skip
            raise
        reservation = Reservation(reservation.id, tool, side_effect, cost, reservation.budgets, reservation.step,
                                  windows, lease)  # fmt: skip
        with self._lock:
            self._open[reservation.id] = reservation
        return reservation

    def _reserve_counted(self, plan: _Plan, tool: str, side_effect: str, cost: float) -> Reservation:
        """`reserve` for budgets of this run limiting only calls and cost (no window, wall time or shared
        pool): the same checks, in the same order, without reading the clocks."""
        with self._lock:
            used_by = self._used
            for budget, name, calls, limit_cost in plan.local:
                used = used_by[name]
                problem = None
                if calls is not None and used.calls + 1 > calls:
                    problem = f"{used.calls} of {calls} calls used"
                elif limit_cost is not None and used.cost + cost > limit_cost:
                    problem = f"cost {_num(used.cost)} used + {_num(cost)} would pass the limit of {_num(limit_cost)}"
                if problem:
                    per = " this step" if budget.spec.per == "step" else ""
                    raise BudgetExceeded(f"{tool}: budget '{name}' exhausted{per}: {problem}", tool=tool,
                                         budget=name)
            for _, name, _, _ in plan.local:
                used = used_by[name]
                used.calls += 1
                used.cost += cost
            reservation = Reservation(next(self._ids), tool, side_effect, cost, plan.names, self._step)
            self._open[reservation.id] = reservation
            return reservation

    def _live(self, reservation: Reservation) -> list[_Used]:
        """The local usage records a reservation still affects (step and window budgets only in their own)."""
        windows = dict(reservation.windows) if reservation.windows else {}
        by_name, step = self._by_name, self._step
        out = []
        for name in reservation.budgets:
            spec = by_name[name].spec
            if spec.shared or (spec.per == "step" and reservation.step != step):
                continue
            if spec.window is not None and windows.get(name) != self._window.get(name):
                continue
            out.append(self._used[name])
        return out

    def settle(self, hold: BudgetHold, *, duration_ns: int, cost: float | None = None) -> None:
        """The call ran for `duration_ns`; `cost`, when given, replaces the reserved cost."""
        reservation = Reservation.given_back(hold, "budget Ledger")
        if not reservation.budgets:
            return
        with self._lock:
            if self._open.pop(reservation.id, None) is None:
                return
            for used in self._live(reservation):
                used.wall_ns += max(0, int(duration_ns))
                if cost is not None:
                    used.cost += cost - reservation.cost
        if reservation.lease is not None:
            self.shared.settle(reservation.lease, duration_ns=duration_ns, cost=cost)

    def release(self, hold: BudgetHold) -> None:
        """The call did not run: give back its call and its cost."""
        reservation = Reservation.given_back(hold, "budget Ledger")
        if not reservation.budgets:
            return
        with self._lock:
            if self._open.pop(reservation.id, None) is None:
                return
            for used in self._live(reservation):
                used.calls -= 1
                used.cost -= reservation.cost
        if reservation.lease is not None:
            self.shared.release(reservation.lease)

    def replay(self, tool: str, side_effect: str, cost: float, duration_ns: int) -> None:
        """Count a call that ran before a resume in this run's own budgets (never refused).

        Shared pools (principal, label, global) are left alone: they counted the call when it ran.
        """
        cost = cost or 0
        with self._lock:
            now_s = self._wall()
            for budget in self._budgets_for(tool, side_effect):
                if budget.spec.shared:
                    continue
                if budget.spec.window is not None:
                    self._roll(budget, now_s)
                used = self._used[budget.name]
                used.calls += 1
                used.cost += cost
                used.wall_ns += max(0, int(duration_ns))

    def _model_claims(self) -> list[Claim]:
        now_s = self._wall()
        return [self._claim(b, now_s) for b in self._budgets if b.spec.shared and b.spec.match is None]

    def charge_model(self, tokens: int, cost_usd: float, *, shared: bool = True) -> None:
        """Record what a model reply used (counted by every budget without `match`).

        `shared=False` for a reply replayed on resume: shared pools counted it the first time.
        """
        with self._lock:
            for budget in self._budgets:
                if budget.spec.match is None and not budget.spec.shared:
                    used = self._used[budget.name]
                    used.model_tokens += tokens
                    used.model_cost_usd += cost_usd
        claims = self._model_claims() if shared else []
        if claims:
            try:
                self.shared.charge(claims, tokens=tokens, cost_usd=cost_usd)
            except Exception as exc:  # noqa: BLE001 - the reply came; a lost charge must not end the run here
                from proctor.telemetry.logging import get_logger

                get_logger("proctor.budgets").error("model_charge_lost", tokens=tokens, error=repr(exc))

    def check_model(self) -> None:
        """Raise BudgetExceeded when a model_tokens or model_cost_usd limit has been reached."""
        usage = self.usage()
        for budget in self._budgets:
            used, limit = usage[budget.name], budget.spec.limit
            tokens, usd = used.get("model_tokens"), used.get("model_cost_usd")
            if limit.model_tokens is None and limit.model_cost_usd is None:
                continue
            if tokens is None or usd is None:
                raise LedgerUnavailable(f"budget '{budget.name}': the budget ledger {self.shared.url} cannot be read",
                                        budget=budget.name)  # fmt: skip
            if limit.model_tokens is not None and tokens >= limit.model_tokens:
                problem = f"{tokens} of {limit.model_tokens} model tokens used"
            elif limit.model_cost_usd is not None and usd >= limit.model_cost_usd:
                problem = f"${usd:.4f} of ${limit.model_cost_usd:g} model cost used"
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
                if budget.spec.shared:  # its pool for this run (principal, label, global) in the shared ledger
                    self._preload_shared(budget, used, fields)
                    continue
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

    def _preload_shared(self, budget: _Budget, used: Mapping[str, float], fields: tuple[str, ...]) -> None:
        if not isinstance(self.shared, MemoryLedger):
            raise ValueError(f"budget {budget.name!r} is shared ({budget.spec.per}); only an in-memory ledger "
                             "can start from recorded usage")
        unknown = [k for k in used if k not in fields]
        if unknown:
            raise ValueError(f"budget {budget.name!r}: unknown usage {unknown[0]!r} (expected {', '.join(fields)})")
        pool = PoolUsage(int(used.get("calls", 0)), used.get("cost", 0), int(used.get("wall_time_ms", 0) * 1_000_000),
                         int(used.get("model_tokens", 0)), float(used.get("model_cost_usd", 0.0)))
        self.shared.preload(pool_key(budget.spec, self._run, self._wall()), pool)

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

    def restore(self, snapshot: Mapping[str, Any]) -> None:
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
        """What each budget has used: calls, cost, wall_time_ms, model_tokens, model_cost_usd.

        A shared budget whose ledger cannot be read reports None for each (a condition reading
        it fails, and so denies).
        """
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            now = self._clock()
            now_s = self._wall()
            for b in self._budgets:
                if b.spec.shared:
                    continue
                if b.spec.window is not None:
                    self._roll(b, now_s)
                used = self._used[b.name]
                out[b.name] = {
                    "calls": used.calls,
                    "cost": _num(used.cost),
                    "wall_time_ms": self._wall_ns(b, now) // 1_000_000,
                    "model_tokens": used.model_tokens,
                    "model_cost_usd": used.model_cost_usd,
                }
        shared = [b for b in self._budgets if b.spec.shared]
        if shared:
            keys = {b.name: pool_key(b.spec, self._run, now_s) for b in shared}
            try:
                pools = self.shared.usage(list(keys.values()))
            except Exception:  # noqa: BLE001 - unknown usage reads as None: fail closed where it matters
                pools = {}
            for b in shared:
                pool = pools.get(keys[b.name])
                out[b.name] = (
                    {"calls": pool.calls, "cost": _num(pool.cost), "wall_time_ms": pool.wall_ns // 1_000_000,
                     "model_tokens": pool.model_tokens, "model_cost_usd": pool.model_cost_usd}
                    if pool is not None else dict.fromkeys(_KINDS)
                )  # fmt: skip
        return {b.name: out[b.name] for b in self._budgets}

    def spend(self, hold: BudgetHold) -> dict[str, dict[str, Any]]:
        """What the reserved call takes from each budget it counts against, for the limits that budget sets
        on a call's count and cost (``{"one-charge": {"calls": 1}, "outbound": {"calls": 1, "cost": 10}}``);
        the time it runs is counted once it ran. An approver reads it beside `remaining`."""
        out: dict[str, dict[str, Any]] = {}
        reservation = Reservation.given_back(hold, "budget Ledger")
        for name in reservation.budgets:
            budget = self._by_name.get(name)
            if budget is None:
                continue
            limit = budget.spec.limit
            takes: dict[str, Any] = {}
            if limit.calls is not None:
                takes["calls"] = 1
            if limit.cost is not None:
                takes["cost"] = _num(reservation.cost)
            out[name] = takes
        return out

    def remaining(self) -> dict[str, dict[str, Any]]:
        """What each budget may still use, for the limits it sets (never below zero; None when unknown)."""
        used_now = self.usage()
        out: dict[str, dict[str, Any]] = {}
        for b in self._budgets:
            limit, used = b.spec.limit, used_now[b.name]
            left: dict[str, Any] = {}
            for kind, cap, scale in (("calls", limit.calls, 1), ("cost", limit.cost, 1),
                                     ("wall_time_ms", limit.wall_time, 1000),
                                     ("model_tokens", limit.model_tokens, 1),
                                     ("model_cost_usd", limit.model_cost_usd, 1)):  # fmt: skip
                if cap is None:
                    continue
                if used[kind] is None:
                    left[kind] = None
                elif kind == "wall_time_ms":
                    left[kind] = max(0, int(cap * scale) - used[kind])
                elif kind == "cost":
                    left[kind] = _num(max(0.0, cap - used[kind]))
                elif kind == "model_cost_usd":
                    left[kind] = max(0.0, cap - used[kind])
                else:
                    left[kind] = max(0, int(cap) - used[kind])
            out[b.name] = left
        return out


_KINDS = ("calls", "cost", "wall_time_ms", "model_tokens", "model_cost_usd")
