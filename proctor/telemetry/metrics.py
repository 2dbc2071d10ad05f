"""Metrics for calls, approvals, budgets and runs, through the OpenTelemetry metrics API.

The instruments come from the global meter provider, which is a no-op proxy until
`proctor.telemetry.setup.configure_tracing` (or the application) installs an SDK one.
Counters and gauges are totalled in plain dicts and reported when the SDK collects, so
a call costs one histogram record plus a few dict updates. The span handles in
`proctor.telemetry.spans` call these functions themselves: the gate needs no extra
line for metrics.

Names and units:

- `proctor.decisions` (counter, ``{call}``): every finished call, by `gen_ai.tool.name`,
  `proctor.decision` (allow | deny | require_approval | none), `proctor.side_effect`,
  `proctor.status` (ok | denied | failed | timeout) and `error.type`.
- `gen_ai.execute_tool.duration` (histogram, s): the `execute_tool` span's duration, by
  `gen_ai.operation.name`, `gen_ai.tool.name`, `proctor.status`, `error.type`.
- `proctor.approval.wait` (histogram, s): time waiting for a human, by tool and outcome.
- `proctor.budget.remaining` (gauge): left in each budget after a reservation, by
  `proctor.budget.name` and `proctor.budget.kind` (calls, cost, wall_time…).
- `gen_ai.invoke_agent.duration` (histogram, s) and `proctor.steps` (counter) for runs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation
from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.trace import Tracer

from proctor.telemetry import semconv as sc
from proctor.telemetry.base import is_noop

__all__ = [
    "enabled",
    "quiet",
    "record_agent",
    "record_approval",
    "record_budget",
    "record_call",
    "record_shadow",
    "record_step",
    "use_meter_provider",
]

_METER_NAME = "proctor"

# Tool calls run from ~30 µs (a lookup through the gate) to minutes (a slow API), so the
# buckets start far below the SDK default (0, 5, 10, … meant for milliseconds).
TOOL_DURATION_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)
# Humans answer in seconds to hours; callbacks and grants in milliseconds.
APPROVAL_WAIT_BUCKETS: tuple[float, ...] = (
    0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)
AGENT_DURATION_BUCKETS: tuple[float, ...] = (
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1800.0,
)


class _Instruments:
    """The instruments of one meter, and the running totals its observable instruments report.

    A synchronous SDK counter or gauge costs ~7 µs a call on a busy machine (attribute
    hashing under a lock), so counts and last values are kept here in plain dicts (under
    a lock: concurrent calls must not lose counts) and handed to the SDK only when it
    collects. Only the duration histogram is recorded synchronously: the API has no
    observable histogram.
    """

    def __init__(self, meter: Meter) -> None:
        self._lock = threading.Lock()
        self._decisions: dict[tuple[str, str, str, str, str | None], int] = {}
        self._budgets: dict[tuple[str, str], int | float] = {}
        self._steps: dict[str, int] = {}
        self._shadow: dict[tuple[str, str, str], int] = {}
        meter.create_observable_counter(
            sc.PROCTOR_DECISIONS, callbacks=[self._observe_decisions], unit="{call}",
            description="Tool calls by policy decision, side-effect class and status")
        meter.create_observable_gauge(
            # No unit: kinds differ (calls, cost, seconds), and "1" would become a _ratio suffix in Prometheus.
            sc.PROCTOR_BUDGET_REMAINING, callbacks=[self._observe_budgets], unit="",
            description="What a budget has left after the last reservation")
        meter.create_observable_counter(sc.PROCTOR_STEPS, callbacks=[self._observe_steps], unit="{step}",
                                        description="Agent steps")
        meter.create_observable_counter(
            sc.PROCTOR_SHADOW_DISAGREEMENTS, callbacks=[self._observe_shadow], unit="{call}",
            description="Calls a shadow policy decided otherwise than the enforced one")
        self.tool_duration = meter.create_histogram(
            sc.GEN_AI_EXECUTE_TOOL_DURATION, unit="s", description="Duration of a tool call through the gate",
            explicit_bucket_boundaries_advisory=TOOL_DURATION_BUCKETS)
        self.approval_wait = meter.create_histogram(
            sc.PROCTOR_APPROVAL_WAIT, unit="s", description="Time a call waited for approval",
            explicit_bucket_boundaries_advisory=APPROVAL_WAIT_BUCKETS)
        self.agent_duration = meter.create_histogram(
            sc.GEN_AI_INVOKE_AGENT_DURATION, unit="s", description="Duration of an agent run",
            explicit_bucket_boundaries_advisory=AGENT_DURATION_BUCKETS)

    def count_decision(self, key: tuple[str, str, str, str, str | None]) -> None:
        with self._lock:
            self._decisions[key] = self._decisions.get(key, 0) + 1

    def set_budget(self, name: str, kind: str, left: int | float) -> None:
        with self._lock:
            self._budgets[(name, kind)] = left

    def count_step(self, agent_name: str) -> None:
        with self._lock:
            self._steps[agent_name] = self._steps.get(agent_name, 0) + 1

    def count_shadow(self, key: tuple[str, str, str]) -> None:
        with self._lock:
            self._shadow[key] = self._shadow.get(key, 0) + 1

    def _observe_shadow(self, options: CallbackOptions) -> Iterator[Observation]:
        with self._lock:
            items = list(self._shadow.items())
        for (tool, enforced, shadow), count in items:
            yield Observation(count, {sc.GEN_AI_TOOL_NAME: tool, sc.PROCTOR_DECISION: enforced,
                                      "proctor.shadow.decision": shadow})

    def _observe_decisions(self, options: CallbackOptions) -> Iterator[Observation]:
        with self._lock:
            items = list(self._decisions.items())
        for (tool, decision, side_effect, status, error_type), count in items:
            attrs = {sc.GEN_AI_TOOL_NAME: tool, sc.PROCTOR_DECISION: decision, sc.PROCTOR_SIDE_EFFECT: side_effect,
                     sc.PROCTOR_STATUS: status}
            if error_type:
                attrs[sc.ERROR_TYPE] = error_type
            yield Observation(count, attrs)

    def _observe_budgets(self, options: CallbackOptions) -> Iterator[Observation]:
        with self._lock:
            items = list(self._budgets.items())
        for (name, kind), left in items:
            yield Observation(left, {sc.PROCTOR_BUDGET_NAME: name, sc.PROCTOR_BUDGET_KIND: kind})

    def _observe_steps(self, options: CallbackOptions) -> Iterator[Observation]:
        with self._lock:
            items = list(self._steps.items())
        for agent_name, count in items:
            yield Observation(count, {sc.GEN_AI_AGENT_NAME: agent_name})


# Bound to the global provider's proxy: it forwards to the SDK once one is installed.
_inst = _Instruments(metrics.get_meter(_METER_NAME))
_own_provider = False
_MISSING = object()


def enabled() -> bool:
    """Whether anything would receive metrics: a provider given to `use_meter_provider`, or a global one.

    Reads the global the API's proxy meters read (the public `get_meter_provider()` costs an
    os.environ lookup per call); should it ever vanish, the answer is True and metrics flow.
    """
    return _own_provider or getattr(metrics_internal, "_METER_PROVIDER", _MISSING) is not None


def quiet(tracer: Tracer) -> bool:
    """Whether nothing would receive a call's span or its metrics: not `enabled()` and `is_noop(tracer)`
    (the gate asks at every call's start; ~35 ns more than both checks written out here, which would
    copy `is_noop`'s reading of OpenTelemetry's private global)."""
    return not enabled() and is_noop(tracer)


def use_meter_provider(provider: MeterProvider | None) -> None:
    """Record into `provider` from now on, with fresh totals (None: back to the global provider)."""
    global _inst, _own_provider
    meter = provider.get_meter(_METER_NAME) if provider is not None else metrics.get_meter(_METER_NAME)
    _inst = _Instruments(meter)
    _own_provider = provider is not None


def record_call(*, tool: str, decision: str | None, side_effect: str | None, status: str,
                error_type: str | None, duration_s: float) -> None:
    """One finished call (allowed, refused or failed)."""
    if not enabled():
        return
    inst = _inst
    inst.count_decision((tool, decision or "none", side_effect or "unknown", status, error_type))
    attrs: dict[str, str] = {sc.GEN_AI_OPERATION_NAME: sc.EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: tool,
                             sc.PROCTOR_STATUS: status}
    if error_type:
        attrs[sc.ERROR_TYPE] = error_type
    inst.tool_duration.record(duration_s, attrs)


def record_approval(*, tool: str, outcome: str, wait_s: float) -> None:
    """One approval answered (or timed out) after `wait_s` seconds."""
    if not enabled():
        return
    _inst.approval_wait.record(wait_s, {sc.GEN_AI_TOOL_NAME: tool, sc.PROCTOR_APPROVAL_OUTCOME: outcome})


def record_budget(remaining: Mapping[str, Mapping[str, Any]]) -> None:
    """What each budget has left, as `ledger.remaining()` reports it (non-numbers are skipped)."""
    if not enabled():
        return
    inst = _inst
    for name, limits in remaining.items():
        for kind, left in limits.items():
            if isinstance(left, (int, float)) and not isinstance(left, bool):
                inst.set_budget(name, kind, left)


def record_agent(*, agent_name: str, duration_s: float, error_type: str | None) -> None:
    """One finished agent run."""
    if not enabled():
        return
    attrs = {sc.GEN_AI_OPERATION_NAME: sc.INVOKE_AGENT, sc.GEN_AI_AGENT_NAME: agent_name}
    if error_type:
        attrs[sc.ERROR_TYPE] = error_type
    _inst.agent_duration.record(duration_s, attrs)


def record_shadow(*, tool: str, enforced: str, shadow: str) -> None:
    """One call a shadow policy decided `shadow` where the enforced policy decided `enforced`."""
    if not enabled():
        return
    _inst.count_shadow((tool, enforced, shadow))


def record_step(*, agent_name: str) -> None:
    """One agent step started."""
    if not enabled():
        return
    _inst.count_step(agent_name)
