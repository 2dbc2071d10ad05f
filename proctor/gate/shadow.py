"""A shadow policy: a candidate decides every call beside the enforced one, and never acts.

`Gate(policy, shadow=candidate)` (or `--shadow P` on the command line) admits each call a
second time, with the candidate, through the same `proctor.policy.admission.admit` and
on the inputs the enforced admission had (tool, arguments, run history, `seen`, provenance,
run facts); its budgets are counted on a ledger of its own per run (what its conditions see
as `usage`), fed with the calls that really went on (an approver's edit as edited), on the
run's clock and steps. Where the two verdicts differ — outcome, or the budget that refused —
the gate's recorder writes a `shadow_decision` record with both decisions and their rules,
the call's span gets a `proctor.shadow_decision` event, and the `proctor.shadow.disagreements`
counter goes up. Nothing the shadow does changes a call: a candidate that raises is logged and
skipped.

Off the call's critical path: the enforced decision is acted on first. The candidate's
decision waits in its run's queue, with a snapshot of what the enforced admission saw (the
history as of then, `seen`, the run's facts), and is made when the call's reply has gone —
after `on_result` for a call that ran, which is how a program's call is answered, so the
program runs on meanwhile — or before the gate asks a human. Decisions of one run are made
one at a time in the order their calls were admitted, so each sees the shadow's budgets as
the calls before it left them. A candidate that reads provenance, a managed agent's call
(whose layers' budgets move while it runs) and a call whose arguments hold a list or a map
(the tool gets the very objects, and may change them) are decided at once instead, before
the tool runs: the index, those budgets and those values are live.

In a durable run, a call answered from the journal on resume is not decided again (it was when it
first ran) but counts in the shadow's budgets, as in the run's (`replayed`). The shadow's budgets
are not kept in the store: after a resume they hold the calls from the resumed step on.

The shadow's budgets wider than a run (`per: principal`, `global`) count this gate's
calls only, on one pool for all its runs: a shadow observes, and a shared pool must not be
charged by a policy that is not enforced. A managed agent's call is decided with the agent's
own policy as its layer, as the enforced one is (the candidate replaces the run's policy only),
over a copy of that layer's budgets kept by the shadow and fed as the layer's are.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from proctor.calls import BudgetHold, CallRecord
from proctor.errors import BudgetExceeded
from proctor.gate.call import InFlight
from proctor.gate.recorder import Recorder, safely
from proctor.ledger.memory import MemoryLedger
from proctor.narrowing import Layer, StackedLedger
from proctor.policy.admission import Admission, LazyUsage, admit
from proctor.policy.simulate import RecordedRun
from proctor.provenance import USER, ProvenanceIndex, ProvenanceLimits
from proctor.redaction import scrub, secret_values
from proctor.telemetry import metrics
from proctor.telemetry import semconv as sc
from proctor.telemetry.logging import get_logger

if TYPE_CHECKING:
    from proctor.gate.gate import PolicyLike
    from proctor.gate.run import Ledger, RunContext
    from proctor.tools import Tool

__all__ = ["PendingDecision", "Shadow", "Verdict", "shadow_view"]

log = get_logger("proctor.gate")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a policy made of a call before any human: allow, require_approval or deny (by which budget)."""

    outcome: str
    rules: tuple[str, ...]
    reason: str
    budget: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"decision": self.outcome, "rules": list(self.rules), "reason": self.reason, "budget": self.budget}


def verdict_of(adm: Admission, refused: BudgetExceeded | None = None) -> Verdict:
    """The verdict of an admission, and of its budgets when one `refused` the call."""
    if refused is not None:
        return Verdict("deny", adm.decision.rules if adm.decision is not None else (), str(refused), refused.budget)
    if adm.decision is not None and adm.stage in ("policy", "decided"):
        return Verdict(adm.decision.outcome, adm.decision.rules, adm.decision.reason)
    rules = adm.decision.rules if adm.decision is not None else ()
    return Verdict("deny", rules, str(adm.refusal))


def _outcome(adm: Admission, refused: BudgetExceeded | None) -> tuple[str, str | None]:
    """`verdict_of(adm, refused)`'s outcome and budget, all a comparison reads (a `Verdict` is made only
    for a disagreement's record)."""
    if refused is not None:
        return "deny", refused.budget
    if adm.decision is not None and adm.stage in ("policy", "decided"):
        return adm.decision.outcome, None
    return "deny", None


_SCALARS = frozenset((str, int, float, bool, type(None)))


def _immutable(args: Mapping[str, Any] | None) -> bool:
    """Whether the call's arguments stay as admitted while its tool runs: a list or map inside them is
    the tool's to change in place, so such a call is decided before the tool runs."""
    return args is None or all(type(value) in _SCALARS for value in args.values())


def _count(ledger: Ledger, tool: str, adm: Admission) -> None:
    """Count a call that went on in every budget of `ledger`, its pools too; where they would refuse it (it
    ran all the same), in the run's own budgets at least."""
    try:
        hold = ledger.reserve(tool, adm.side_effect, adm.cost)
    except BudgetExceeded:
        ledger.replay(tool, adm.side_effect, adm.cost, 0)
    else:
        ledger.settle(hold, duration_ns=0)


def shadow_view(ctx: RunContext, run: _Run, usage: Mapping[str, Any]) -> RecordedRun:
    """The run as a gate enforcing the candidate would see it at one call's admission
    (`proctor.policy.admission.RunView`), for the candidate's decision made later: the history as of then (an
    O(1) snapshot of the run's rows) and the run's facts; `seen` and the provenance index as the candidate's own
    labels make them (`run`); the shadow's own budgets as `usage`."""
    return RecordedRun(ctx.info, ctx.history_view(), run.seen_sorted, usage, run.index)


class _Run:
    """One run's shadow: its budgets, what the run has read and where values came from by the candidate's
    labels, and the candidate's decisions waiting to be made, in call order."""

    __slots__ = ("index", "ledger", "lock", "mirror_steps", "mirrors", "queue", "seen", "seen_sorted", "step")

    def __init__(self, ledger: Ledger, index: ProvenanceIndex | None, step: int = 0) -> None:
        self.ledger = ledger
        #: The run's step the ledger counts `per: step` budgets for (advanced as the decisions reach the next).
        self.step = step
        #: Each managed agent's layer in the run (an invocation's own policy and budgets), and the shadow's
        #: copy of it: that policy over budgets of the shadow's own, fed as the layer's are.
        self.mirrors: dict[Layer, Layer] = {}
        #: The managed agent's own step each copy counts `per: step` budgets for (an agent counts from 0).
        self.mirror_steps: dict[Layer, int] = {}
        #: The results of the run's calls indexed under the candidate's labels (None: it reads no provenance).
        self.index = index
        #: The candidate's labels of the tools whose calls ran (`seen` in its conditions).
        self.seen: set[str] = set()
        self.seen_sorted: tuple[str, ...] = ()
        self.queue: deque[PendingDecision] = deque()
        self.lock = threading.Lock()  # held while decisions are made: one at a time, in order

    def ran(self, labels: tuple[str, ...]) -> None:
        if labels and not self.seen.issuperset(labels):
            self.seen.update(labels)
            self.seen_sorted = tuple(sorted(self.seen))


class PendingDecision:
    """A call the candidate is to decide (`InFlight.shadow`): its inputs as the enforced admission had them,
    the enforced verdict once known, and the candidate's reservation on the shadow's budgets once made."""

    __slots__ = ("args", "enforced", "expected", "labels", "layers", "ledger", "p", "refused", "reservation", "run",
                 "tools", "view")

    def __init__(self, p: InFlight, args: Mapping[str, Any] | None, tools: Mapping[str, Tool],
                 expected: Tool | None, view: RecordedRun, run: _Run, layers: tuple[Layer, ...] = (),
                 ledger: Ledger | None = None) -> None:
        self.p, self.args, self.tools, self.expected, self.view, self.run = p, args, tools, expected, view, run
        #: The shadow's copies of the call's layers, and the budgets it is counted on: the shadow's run ledger
        #: stacked with each copy's (as the run's ledger is with each layer's: `StackedLedger`).
        self.layers = layers
        self.ledger: Ledger = ledger if ledger is not None else run.ledger
        #: The enforced admission once its budgets answered, and the budget's refusal if one refused it.
        self.enforced: Admission | None = None
        self.refused: BudgetExceeded | None = None
        self.reservation: BudgetHold | None = None
        #: The candidate's labels of the call's tool, once it decided the call (what `seen` gains if it runs).
        self.labels: tuple[str, ...] = ()


class Shadow:
    """One gate's shadow policy, the per-run ledgers of its budgets and its decisions still to make.

    The gate tells it about each call in turn: `admitted` (what the enforced admission saw),
    `decided` (the enforced verdict, once its budgets answered), `asking` (before a human is asked)
    and `ended` (the call is over and answered, whether its tool ran)."""

    def __init__(self, policy: PolicyLike, recorder: Recorder, limits: ProvenanceLimits | None = None) -> None:
        self.policy = policy
        self.recorder = recorder
        self._limits = limits or ProvenanceLimits()
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()
        #: The pools of the candidate's budgets wider than a run (`per: principal`, `label:`, `global`): one for
        #: the gate's every run, in this process only (a policy not enforced never charges a shared pool).
        self._pools = MemoryLedger()

    def admitted(self, p: InFlight, args: Mapping[str, Any] | None, tools: Mapping[str, Tool],
                 expected: Tool | None) -> None:
        """Keep what the enforced admission of call `p` saw, for the candidate's decision."""
        try:
            run = self._run(p.ctx)
            layers = self._mirrors(run, p.ctx) if p.ctx.layers else ()
            ledger: Ledger = run.ledger
            for mirror in layers:
                ledger = StackedLedger(ledger, mirror.ledger, agent=mirror.agent)
            p.shadow = PendingDecision(p, args, tools, expected, shadow_view(p.ctx, run, LazyUsage(ledger)), run,
                                       layers, ledger)
        except Exception as exc:  # noqa: BLE001 - the shadow never changes a call
            log.error("shadow_policy_failed", tool=p.name, error=repr(exc))

    def started(self, ctx: RunContext, task: str | None, *, resumed: bool = False) -> None:
        """Run `ctx` starts (or is `resumed`): a candidate reading provenance gets the run's task as the user's
        words, as a gate enforcing it would; a resumed run's earlier results are not in its index (fail safe)."""
        try:
            run = self._run(ctx)
            if run.index is not None:
                if task:
                    run.index.add(task, (USER,))
                if resumed:
                    run.index.mark_incomplete(self.policy.result_labels)
        except Exception as exc:  # noqa: BLE001 - the shadow never changes a run
            log.error("shadow_policy_failed", run_id=ctx.info.id, error=repr(exc))

    def decided(self, p: InFlight, enforced: Admission, refused: BudgetExceeded | None = None) -> None:
        """The enforced verdict on `p` is known (its admission, and the budget that `refused` it if one did):
        queue the candidate's decision (made at once when its inputs would not keep until the reply: a
        candidate reading provenance, a managed agent's call)."""
        pending = p.shadow
        if pending is None or pending.enforced is not None:
            return
        pending.enforced, pending.refused = enforced, refused
        pending.run.queue.append(pending)
        if self.policy.uses_provenance or p.ctx.layers or not _immutable(pending.args):
            self._drain(pending.run)

    def asking(self, p: InFlight) -> None:
        """Call `p` waits for a human: make the candidate's decisions now rather than after the answer."""
        pending = p.shadow
        if pending is not None:
            self._drain(pending.run)

    def ended(self, p: InFlight, *, ran: bool) -> None:
        """Call `p` is over (and answered): the candidate decides it if it has not, and its reservation on
        the shadow's budgets is counted if the tool `ran`, else given back."""
        pending = p.shadow
        if pending is None:
            return
        p.shadow = None
        if pending.enforced is None:  # the gate failed before the enforced verdict: nothing to compare
            return
        self._drain(pending.run)
        if ran:
            self._ran(pending)
        edited = ran and p.approval is not None and p.approval.verdict == "edit"
        if pending.reservation is None and not edited:
            return
        try:
            if edited:
                # An approver's edit ran instead of the call admitted: the budgets count the call that went on,
                # as the candidate classes and costs its arguments (the run's ledger reserved it anew too).
                if pending.reservation is not None:
                    pending.ledger.release(pending.reservation)
                adm = admit(self.policy, p.name, p.args, tools=pending.tools, run=pending.view,
                            layers=pending.layers, expected=pending.expected)
                if adm.stage == "decided":
                    _count(pending.ledger, p.name, adm)
            elif pending.reservation is not None and ran:
                pending.ledger.settle(pending.reservation, duration_ns=0)
            elif pending.reservation is not None:
                pending.ledger.release(pending.reservation)
        except Exception as exc:  # noqa: BLE001 - the shadow never changes a call
            log.error("shadow_policy_failed", tool=p.name, error=repr(exc))

    def replayed(self, p: InFlight, record: CallRecord, *, counted: bool) -> None:
        """Call `p` of a resumed step was answered from the durable run's journal: the candidate decided it when it
        first ran, so it is not decided again; when it ran (and the replay is `counted`, as the run's own budgets
        count it then: `StepJournal`), the shadow's budgets count it too, as the candidate classes and costs it."""
        pending = p.shadow
        if pending is None:
            return
        p.shadow = None
        if not counted or record.status not in ("ok", "failed", "timeout"):
            return
        self._drain(pending.run)  # the calls before it first, in order
        try:
            adm = admit(self.policy, p.name, pending.args, tools=pending.tools, run=pending.view,
                        layers=pending.layers, expected=pending.expected)
            if adm.stage == "decided":
                pending.ledger.replay(p.name, adm.side_effect, adm.cost, record.duration_ns)
            if adm.facts is not None:  # it ran (its result is not at hand: a resumed run's index is incomplete)
                pending.run.ran(adm.facts.labels)
        except Exception as exc:  # noqa: BLE001 - the shadow never changes a call
            log.error("shadow_policy_failed", tool=p.name, error=repr(exc))

    def _ran(self, pending: PendingDecision) -> None:
        """The call's tool ran: its labels (the candidate's) join the run's `seen`, and its result is indexed
        under them, before the run's next call is admitted."""
        p, run, labels = pending.p, pending.run, pending.labels
        if not labels:
            return
        run.ran(labels)
        if run.index is None:
            return
        try:
            run.index.add_result(str(p.error) if p.error is not None else p.value, labels,
                                 self.policy.result_sources(p.name), p.args, tool=p.name)
        except Exception as exc:  # noqa: BLE001 - the shadow never changes a call; its index then errs to the labels
            log.error("shadow_policy_failed", tool=p.name, error=repr(exc))
            run.index.mark_incomplete(labels)

    def finished(self, run_id: str) -> None:
        """Make the decisions left of a run that ended, then forget its ledger."""
        with self._lock:
            run = self._runs.pop(run_id, None)
        if run is not None:
            self._drain(run)

    def _run(self, ctx: RunContext) -> _Run:
        run_id = ctx.info.id
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                index = ProvenanceIndex(self._limits) if self.policy.uses_provenance else None
                ledger = self.policy.new_ledger(ctx.info, self._pools)
                if ctx.parent_call_id is None:
                    # Its clock from the run's start and step's, as the run's ledger counts wall time (the
                    # shadow's first call may come long after): no usage, only the time and the step.
                    begun = ctx.ledger.snapshot()
                    ledger.restore({"elapsed_ns": begun.get("elapsed_ns", 0),
                                    "step_elapsed_ns": begun.get("step_elapsed_ns", 0),
                                    "step": cast(int, begun.get("step", 0))})
                run = self._runs[run_id] = _Run(ledger, index, ctx.info.step)
            return run

    def _mirrors(self, run: _Run, ctx: RunContext) -> tuple[Layer, ...]:
        """The shadow's copies of `ctx`'s layers: each managed agent's own policy (the same: a candidate replaces
        the run's policy only) over budgets of the shadow's own, so that its conditions' `usage` and its budgets'
        refusals are the layer's as the enforced admission had them, and nothing the shadow does charges them."""
        mirrors: list[Layer] = []
        with self._lock:
            for layer in ctx.layers:
                mirror = run.mirrors.get(layer)
                if mirror is None:
                    info = replace(ctx.info, step=0, agent=layer.agent)
                    mirror = run.mirrors[layer] = Layer(layer.agent, layer.policy,
                                                        layer.policy.new_ledger(info, self._pools))
                mirrors.append(mirror)
        return tuple(mirrors)

    def _drain(self, run: _Run) -> None:
        """Make the run's queued decisions, in call order, one at a time."""
        with run.lock:
            while run.queue:
                pending = run.queue.popleft()
                try:
                    self._decide(pending)
                except Exception as exc:  # noqa: BLE001 - the shadow never changes a call
                    log.error("shadow_policy_failed", tool=pending.p.name, error=repr(exc))

    def _decide(self, pending: PendingDecision) -> None:
        p = pending.p
        step = pending.view.info.step
        if p.ctx.parent_call_id is None and step > pending.run.step:
            # The run went on to another step (a managed agent's steps are its own): `per: step` budgets start
            # afresh, as the run's ledger's did — once, however many steps passed without a call.
            pending.run.ledger.next_step()
            pending.run.step = step
        elif p.ctx.parent_call_id is not None and pending.layers and pending.layers[-1].agent == p.ctx.info.agent:
            # The agent's own step: its layer's `per: step` budgets start afresh, as its StackedLedger's do.
            own = pending.layers[-1]
            if step > pending.run.mirror_steps.get(own, 0):
                own.ledger.next_step()
                pending.run.mirror_steps[own] = step
        try:
            adm = admit(self.policy, p.name, pending.args, tools=pending.tools, run=pending.view,
                        layers=pending.layers, expected=pending.expected)
            if adm.facts is not None:
                pending.labels = adm.facts.labels
            refused: BudgetExceeded | None = None
            if adm.stage == "decided":
                try:
                    pending.reservation = pending.ledger.reserve(p.name, adm.side_effect, adm.cost)
                except BudgetExceeded as exc:
                    refused = exc
        except Exception as exc:  # noqa: BLE001 - the shadow never changes a call
            log.error("shadow_policy_failed", tool=p.name, error=repr(exc))
            return
        assert pending.enforced is not None
        if _outcome(adm, refused) == _outcome(pending.enforced, pending.refused):
            return
        enforced, shadow = verdict_of(pending.enforced, pending.refused), verdict_of(adm, refused)
        # A reason can quote an argument (a class expression's value, a pattern that does not compile): the record
        # holds none that either policy redacts, as the gate's own refusals hold none (`Recorder.clean`).
        secrets = set(p.ctx.secrets)
        for facts in (pending.enforced.facts, adm.facts):
            if facts is not None and facts.redact and pending.args:
                secrets |= secret_values(pending.args, facts.redact)
        if secrets:
            enforced = replace(enforced, reason=scrub(enforced.reason, secrets))
            shadow = replace(shadow, reason=scrub(shadow.reason, secrets))
        self.recorder.about(p, "shadow_decision", {
            "run_id": p.ctx.info.id, "call_id": p.call_id, "tool": p.name, "enforced": enforced.as_dict(),
            "shadow": shadow.as_dict(), "policy_sha256": p.policy_sha256, "shadow_sha256": self.policy.sha256})
        safely(p.span.event, sc.SHADOW_DECISION_EVENT, {
            sc.PROCTOR_DECISION: enforced.outcome, "proctor.shadow.decision": shadow.outcome,
            "proctor.shadow.rules": ",".join(shadow.rules), "proctor.shadow.policy_sha256": self.policy.sha256})
        metrics.record_shadow(tool=p.name, enforced=enforced.outcome, shadow=shadow.outcome)
