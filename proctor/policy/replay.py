"""What a policy would have done: every recorded call of an audit log decided again under a new policy.

`replay(policy, records)` walks the records of an audit log in order and rebuilds each run
as the gate kept it — run facts from ``run_started`` (principal, labels, agent), each call
from its ``call_intent`` (tool, class, arguments as recorded, step) and ``call_outcome``
(status, duration) — and decides every call again with `proctor.policy.admission.admit`,
the gate's own decision (no second implementation), over:

- the history the call had: the run's earlier calls whose outcome was recorded before its
  intent, as recorded (their arguments, decisions and statuses), with the new policy's
  class and labels for each tool, as a gate holding the new policy would have kept them;
- `seen`: the new policy's labels of the earlier calls that ran;
- budgets: a ledger of the new policy for each run (shared budgets on one pool for the whole
  replay), fed in record order as the calls happened: a call the new policy admits reserves,
  and is settled with its recorded duration if it ran (released if it did not), on a clock
  that reads each record's own time, so windows and wall-time limits hold as they did.

A call is compared by its effective outcome: the policy's decision, or deny where a budget
refused it (``budget_exhausted`` in the log; a reservation on the replay's ledger) or its cost
could not be computed (``refused_at: "cost"`` on its intent; an admission stopped at "cost").
Recorded arguments are read with canonical JSON's tags undone (a float is recorded as
``{"$float": "2.5"}``: `proctor.canonical.untagged`), so a condition sees the values the gate's did.

Calls the log cannot decide again are counted as undecidable, never guessed:

- a condition (or the tool's `side_effect` / `cost` expression) of the new policy that could
  read a redacted argument — of this call, or of an earlier call through `history` — or that
  reads where values came from (`provenance()`, `from_user()`: the log holds no results);
- a cost budget counts the call and the new policy declares no cost for its tool (a tool's
  own declared cost is not recorded); and, once such a call (or one whose `cost:` expression
  reads a redacted argument) ran, every later call whose decision reads that budget — a
  condition reading its `usage`, or the budget counting the call's cost — since what it holds
  of cost is not known.
- a condition reading the model's usage (``usage.NAME.model_tokens`` / ``model_cost_usd``): the
  agent charged a step's model reply before its program ran, the log records it after the step's calls;
- the log does not hold the call's run from its start (``run_started``: a log that begins
  mid-run, or holds a resumed run from its ``run_resumed`` on) and the decision could read the
  run — a condition or expression naming ``run``, ``history``, ``seen`` or ``usage``, or a
  budget counting the call.

How "could read" is known: each candidate rule's condition is analysed for what it reads of
each variable (`proctor.policy.projection.needs_of`, the analysis the engine projects
variables with: it narrows only when sure, so a field it does not list is never read). That
is sound where deciding twice with two sentinel values is not: two sentinels that agree
(``args.card.startsWith('4')`` is false for both) say nothing about the real value. It may
count a call undecidable whose condition would have short-circuited before the redacted
field; that is the safe side.

- a managed agent's call that the agent's own policy narrowed (``layers`` on its intent: the
  policies' fingerprints, not the policies): its facts, decision and budgets were the strictest
  of the run's policy and those, which replay cannot rebuild; and, after one, a call of the run
  whose condition reads `seen` or an earlier call's class (the labels and class the narrowed
  call added to the run were those policies' too).

What replay does not know: calls refused before the policy decided (an
unknown tool, arguments the schema refused: the tool table decides those, not the policy;
counted as ``not_decided``), and calls answered from a durable run's journal
(``call_replayed``: nothing decided them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

from proctor.calls import SIDE_EFFECTS, HistoryEntry, RunInfo, SideEffect
from proctor.canonical import untagged
from proctor.errors import BudgetExceeded
from proctor.ledger.memory import MemoryLedger
from proctor.policy.admission import Admission, LazyUsage, RunView, admit, facts_of, has_fixed_decision
from proctor.policy.budgets import Ledger
from proctor.policy.conditions import VARIABLES
from proctor.policy.functions import PROVENANCE_FUNCTIONS
from proctor.policy.projection import needs_of, selected_subfields
from proctor.policy.simulate import RAN_STATUSES, RecordedRun

if TYPE_CHECKING:
    from proctor.audit.keys import PublicKeySource
    from proctor.policy.engine import Policy, ToolFacts
    from proctor.provenance import ProvenanceIndex

__all__ = ["EXAMPLES_PER_GROUP", "REDACTED_MARK", "Change", "Observer", "ReplayReport", "Undecidable",
           "iter_log_records", "log_failure",
           "replay", "replay_log"]

#: The key a redacted value is replaced with in recorded arguments (`proctor.redaction`).
REDACTED_MARK = "$redacted"
#: Examples kept for each group of changes.
EXAMPLES_PER_GROUP = 3


@dataclass(frozen=True, slots=True)
class Change:
    """One recorded call whose decision the new policy changes."""

    seq: int
    ts_ns: int
    run_id: str
    call_id: str
    tool: str
    args: Mapping[str, Any]
    old: str
    new: str
    old_rules: tuple[str, ...]
    new_rules: tuple[str, ...]
    new_reason: str
    budget: str | None = None

    @property
    def change(self) -> str:
        return f"{self.old}→{self.new}"

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "ts_ns": self.ts_ns, "run_id": self.run_id, "call_id": self.call_id,
                "tool": self.tool, "args": dict(self.args), "old": self.old, "new": self.new,
                "change": self.change, "old_rules": list(self.old_rules), "new_rules": list(self.new_rules),
                "new_reason": self.new_reason, "budget": self.budget}


@dataclass(frozen=True, slots=True)
class Undecidable:
    """One recorded call the log cannot decide again, and why."""

    seq: int
    run_id: str
    call_id: str
    tool: str
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "run_id": self.run_id, "call_id": self.call_id, "tool": self.tool, "why": self.why}


@dataclass
class _Group:
    count: int = 0
    examples: list[Change] = field(default_factory=list)

    def add(self, change: Change) -> None:
        self.count += 1
        if len(self.examples) < EXAMPLES_PER_GROUP:
            self.examples.append(change)


@dataclass
class ReplayReport:
    """What the new policy would have done to the recorded calls."""

    policy_sha256: str
    #: Calls re-decided (decidable, at or after `since`).
    decided: int = 0
    unchanged: int = 0
    changed: int = 0
    undecidable: int = 0
    #: Calls refused before the policy decided (unknown tool, invalid arguments): not the policy's to change.
    not_decided: int = 0
    #: Record lines that were not a readable record, skipped.
    bad_lines: int = 0
    #: Whether the log's hash chain (and checkpoints, and side file) verified as `proctor audit verify` checks
    #: them: None when not checked; False with `log_failure` saying where it first breaks. A record edited,
    #: deleted, inserted or moved is read as written: the report then cannot vouch for what it says.
    log_intact: bool | None = None
    log_failure: str | None = None
    #: The recorded policies' fingerprints, with how many calls each decided.
    recorded_policies: dict[str, int] = field(default_factory=dict)
    by_change: dict[str, _Group] = field(default_factory=dict)
    by_rule: dict[str, _Group] = field(default_factory=dict)
    #: Undecidable calls counted by why (the reason's text), and the first few of each reason.
    undecidable_why: dict[str, int] = field(default_factory=dict)
    undecidable_by_why: dict[str, list[Undecidable]] = field(default_factory=dict)
    undecidable_examples: list[Undecidable] = field(default_factory=list)

    def note_change(self, change: Change) -> None:
        self.count_change(change.change, change.new_rules, change.old_rules, change.budget, lambda: change)

    def count_change(self, kind: str, new_rules: tuple[str, ...], old_rules: tuple[str, ...], budget: str | None,
                     make: Callable[[], Change]) -> None:
        """Count one changed call under its change (`kind`, ``allow→deny``) and each rule (and budget) that
        decided it; `make` builds the `Change`, asked only while one of those groups still keeps examples
        (a replay that changes most of a million calls builds a handful)."""
        self.changed += 1
        names = tuple(dict.fromkeys((*new_rules, *old_rules)))
        if budget is not None:
            names = (*names, f"budget:{budget}")
        groups = [self.by_change.get(kind) or self.by_change.setdefault(kind, _Group())]
        by_rule = self.by_rule
        for name in names or ("(default)",):
            groups.append(by_rule.get(name) or by_rule.setdefault(name, _Group()))
        change: Change | None = None
        for group in groups:
            group.count += 1
            if len(group.examples) < EXAMPLES_PER_GROUP:
                change = change or make()
                group.examples.append(change)

    def note_undecidable(self, item: Undecidable) -> None:
        self.undecidable += 1
        self.undecidable_why[item.why] = self.undecidable_why.get(item.why, 0) + 1
        examples = self.undecidable_by_why.get(item.why) or self.undecidable_by_why.setdefault(item.why, [])
        if len(examples) < EXAMPLES_PER_GROUP:
            examples.append(item)
        if len(self.undecidable_examples) < EXAMPLES_PER_GROUP * 3:
            self.undecidable_examples.append(item)

    def as_dict(self) -> dict[str, Any]:
        def groups(table: dict[str, _Group]) -> dict[str, Any]:
            return {k: {"count": g.count, "examples": [c.as_dict() for c in g.examples]}
                    for k, g in sorted(table.items(), key=lambda kv: (-kv[1].count, kv[0]))}

        return {"policy_sha256": self.policy_sha256, "decided": self.decided, "unchanged": self.unchanged,
                "changed": self.changed, "undecidable": self.undecidable, "not_decided": self.not_decided,
                "bad_lines": self.bad_lines, "log_intact": self.log_intact, "log_failure": self.log_failure,
                "recorded_policies": dict(self.recorded_policies),
                "by_change": groups(self.by_change), "by_rule": groups(self.by_rule),
                "undecidable_why": dict(sorted(self.undecidable_why.items(), key=lambda kv: -kv[1])),
                "undecidable_by_reason": {
                    why: {"count": count, "examples": [u.as_dict() for u in self.undecidable_by_why.get(why, ())]}
                    for why, count in sorted(self.undecidable_why.items(), key=lambda kv: (-kv[1], kv[0]))},
                "undecidable_examples": [u.as_dict() for u in self.undecidable_examples]}


@dataclass(frozen=True, slots=True)
class _Reads:
    """What the new policy's conditions and expressions for one (tool, class) read of a call."""

    args: frozenset[str] | None  # fields of `args` read (None: the whole value)
    history_args: bool  # whether an earlier call's arguments are read
    provenance: bool  # whether a provenance function is called
    nothing: bool  # no condition at all
    cost_unknown: bool  # a cost budget counts the tool, whose cost the policy does not declare
    #: Nothing can make such a call undecidable — no condition, no side_effect or cost expression, no
    #: unknown cost — so its arguments need not even be looked at for redaction marks (`_undecidable`).
    plain: bool = False
    #: Whether a budget of the new policy counts such a call (else its ledger is not asked: it would
    #: hold nothing for it).
    budgeted: bool = True
    #: The budgets whose usage a condition reads (`usage.NAME`; None: any of them).
    usage: frozenset[str] | None = frozenset()
    #: The budgets with a cost limit that count such a call.
    cost_budgets: frozenset[str] = frozenset()
    #: Whether a condition reads `seen`, or the class of an earlier call (`history`'s side_effect).
    seen: bool = False
    history_class: bool = False
    #: Whether a condition reads the model's usage (`usage.NAME.model_tokens` / `.model_cost_usd`).
    model_usage: bool = False


class _Clock:
    """The replay's clock: the time of the record being replayed (budget windows and wall time)."""

    __slots__ = ("ns",)

    def __init__(self) -> None:
        self.ns = 0

    def mono(self) -> int:
        return self.ns

    def wall(self) -> float:
        return self.ns / 1e9


class _Run:
    """A recorded run as the replay rebuilds it; also the `RunView` its calls are decided over."""

    __slots__ = ("cost_unknown_in", "history", "history_redacted", "info", "last_step", "ledger", "narrowed",
                 "pending", "resumed", "seen", "seen_sorted", "started")

    #: The log holds no tool results: no provenance index (a condition reading one is undecidable).
    provenance: ProvenanceIndex | None = None

    def __init__(self, info: RunInfo, ledger: Ledger, started: bool = True) -> None:
        self.info = info
        self.ledger = ledger
        #: Whether the log holds the run's start (its principal, labels; its calls from the first).
        self.started = started
        #: Whether the log holds it from a resumption (`run_resumed`) but not its start.
        self.resumed = False
        self.history: list[HistoryEntry] = []
        self.history_redacted = False
        #: Whether a call of the run was narrowed by a managed agent's own policy: its class in the history and
        #: the labels it added to `seen` were that policy's too, which the log does not hold.
        self.narrowed = False
        self.seen: set[str] = set()
        self.seen_sorted: tuple[str, ...] = ()
        self.last_step = 0
        #: Budgets of this run whose cost counts a call that ran at a cost the log does not give (`_Replayer`).
        self.cost_unknown_in: set[str] = set()
        #: call_id -> (intent record, reservation or None, the history entry's class and labels, the cost to
        #: count as it happened for a call that could not be decided again — None for the others — and whether
        #: the log cannot give that cost)
        self.pending: dict[str, tuple[Mapping[str, Any], Any, SideEffect, tuple[str, ...], float | None, bool]] = {}

    def history_view(self) -> Sequence[HistoryEntry]:
        return self.history

    def seen_labels(self) -> Sequence[str]:
        return self.seen_sorted

    def usage_view(self) -> Mapping[str, Any]:
        return LazyUsage(self.ledger)  # read only when a condition reads `usage`


#: Told of every call decided again (and counted): its admission, the run as the decision read it,
#: the run's ledger after the call reserved, the new effective outcome and the budget that refused it.
Observer = Callable[[Admission, RunView, Ledger, str, "str | None"], None]


class _Known:
    """What the replay keeps of one (tool, recorded class): the new policy's facts of the tool; the
    admission of every such call when it depends on nothing of the call (else None); and what the new
    policy reads of a call in the class the last admission gave (`reads`, for `reads_class`)."""

    __slots__ = ("admission", "facts", "reads", "reads_class")

    def __init__(self, facts: ToolFacts) -> None:
        self.facts = facts
        self.admission: Admission | None = None
        self.reads: _Reads | None = None
        self.reads_class: str | None = None


class _Replayer:
    def __init__(self, policy: Policy, since_ns: int | None, observe: Observer | None = None) -> None:
        self.policy = policy
        self.observe = observe
        self.since_ns = since_ns
        self.report = ReplayReport(policy.sha256)
        self.clock = _Clock()
        self.shared = MemoryLedger()
        self.runs: dict[str, _Run] = {}
        self.budget_refused: dict[str, str | None] = {}  # call_id -> budget that refused it when recorded
        self._reads: dict[tuple[str, str], _Reads] = {}
        self._expr_reads: dict[str, list[frozenset[str] | None]] = {}
        self._cost_unknown: dict[tuple[str, str], bool] = {}
        self._run_reads: dict[tuple[str, str], bool] = {}
        #: What is known of every call of a (tool, recorded class): its facts, the admission when it is the
        #: same for them all, and what the new policy reads of them (`_Known`).
        self._known: dict[tuple[str, str | None], _Known] = {}
        #: A policy without budgets: one ledger serves every run (it counts nothing, and its usage is empty).
        self._unbudgeted = (None if policy.budgets else
                            Ledger((), shared=self.shared, clock=self.clock.mono, wall_clock=self.clock.wall))
        #: Budgets wider than a run (one pool for all the replay's runs), and those of them whose cost counts a
        #: call that ran at a cost the log does not give (`_Run.cost_unknown_in` for a run's own).
        self._shared_budgets = frozenset(b.name for b in policy.budgets if b.shared)
        self.cost_unknown_shared: set[str] = set()
        #: Whether any condition can read `history` (else no entry is kept: nothing would read it).
        self.keeps_history = any(r.condition is not None and "history" in r.condition.source
                                 for r in policy.compiled)

    # -- runs -------------------------------------------------------------------------------------

    def _run(self, run_id: str, rec: Mapping[str, Any] | None = None) -> _Run:
        run = self.runs.get(run_id)
        if run is None:
            # Only `run_started` is a run's start: a `run_resumed` the log holds without it (the run began in
            # another process's log) names the run's facts, but its calls before the pause are elsewhere.
            principal = rec.get("principal") if rec is not None else None
            labels = rec.get("labels") if rec is not None else None
            agent = rec.get("agent") if rec is not None else None
            info = RunInfo(id=run_id, principal=principal if isinstance(principal, str) else None,
                           labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
                           agent=agent if isinstance(agent, str) else None)
            ledger = self._unbudgeted or Ledger(self.policy.budgets, run=info, shared=self.shared,
                                                clock=self.clock.mono, wall_clock=self.clock.wall)
            started = rec is not None and rec.get("kind") == "run_started"
            run = self.runs[run_id] = _Run(info, ledger, started=started)
            run.resumed = rec is not None and not started
        return run

    def feed(self, rec: Mapping[str, Any]) -> None:
        kind = rec.get("kind")
        ts = rec.get("ts_ns")
        if isinstance(ts, int):
            self.clock.ns = ts
        if kind == "call_intent":
            self._intent(rec)
        elif kind == "call_outcome":
            self._outcome(rec)
        elif kind == "budget_exhausted":
            call_id = rec.get("call_id")
            if isinstance(call_id, str):
                budget = rec.get("budget")
                self.budget_refused[call_id] = budget if isinstance(budget, str) else None
        elif kind in ("run_started", "run_resumed"):
            run_id = rec.get("run_id")
            if isinstance(run_id, str):
                self._run(run_id, rec)
        elif kind == "run_finished":
            run_id = rec.get("run_id")
            # An interrupted run is left for `resume` to take up again (as after a crash): kept, not forgotten.
            if isinstance(run_id, str) and rec.get("status") != "interrupted":
                self.runs.pop(run_id, None)

    # -- calls ------------------------------------------------------------------------------------

    def _intent(self, rec: Mapping[str, Any]) -> None:
        get = rec.get  # (one attribute lookup for the dozen fields read: every recorded call comes here)
        run_id, call_id, tool = get("run_id"), get("call_id"), get("tool")
        if not (isinstance(run_id, str) and isinstance(call_id, str) and isinstance(tool, str)):
            return
        report = self.report
        run = self.runs.get(run_id) or self._run(run_id)
        policy = self.policy
        args = _recorded_args(rec)
        recorded_class = get("side_effect")
        # The class the tool declares itself is what a gate hands the policy (its `tools:` may override it); the
        # intent's `side_effect` is what the recording policy made of it. A log written before intents carried
        # the tool's own class has only the latter.
        own = get("tool_side_effect", _NOT_RECORDED)
        if own is _NOT_RECORDED:
            own = recorded_class
        declared: SideEffect | None = own if own in SIDE_EFFECTS else None
        step = get("step")
        # (a managed agent counts its own steps from 0: the run's step, and its `per: step` budgets, go on)
        if isinstance(step, int) and step != run.last_step and get("parent_call_id") is None:
            # Per-step budgets start afresh, as the gate's `next_step` does: once, however many steps passed
            # without a call (a loop over the gap would let one record with a huge step stop the replay).
            if step > run.last_step:
                run.ledger.next_step()
            run.last_step = step
        old = get("decision")
        budget_refused = self.budget_refused
        refused_by = budget_refused.pop(call_id, _NOT_REFUSED) if budget_refused else _NOT_REFUSED
        counted = self.since_ns is None or self.clock.ns >= self.since_ns
        memo_key = (tool, declared)
        known = self._known.get(memo_key)
        if known is None:
            known = self._known[memo_key] = _Known(facts_of(policy, tool, declared, 0))
        facts = known.facts
        history_class: SideEffect = facts.side_effect
        labels = facts.labels
        if old not in ("allow", "deny", "require_approval"):
            # Refused before the policy decided (unknown tool, invalid arguments): recorded, never re-decided.
            if get("refused_at") == "tool":  # a tool the gate did not hold: its run kept the unknown worst case
                history_class, labels = "destructive", ()
            run.pending[call_id] = (rec, None, history_class, labels, None, False)
            if counted:
                report.not_decided += 1
            return
        info = run.info
        if isinstance(step, int) and step != info.step:
            info = run.info = replace(info, step=step)
        agent = get("agent")  # a managed agent's call names it (`run.agent`)
        if isinstance(agent, str) and agent != info.agent:
            info = replace(info, agent=agent)
        view: RunView = run if info is run.info else RecordedRun(info, run.history, run.seen_sorted,
                                                                 LazyUsage(run.ledger), None)
        adm = known.admission
        if adm is None:
            adm = admit(policy, tool, args, tools=None, run=view, declared_side_effect=declared, declared_cost=0)
            # `admit` is pure, and without tools, a side_effect or cost expression, or a rule with a
            # condition for the (tool, class), it reads nothing of the arguments or the run: its
            # answer for this (tool, declared class) is the same for every call, so it is kept.
            if (adm.stage in ("decided", "policy") and facts.side_effect_expression is None
                    and facts.cost_expression is None and has_fixed_decision(policy, tool, adm.side_effect)):
                known.admission = adm
        side_effect = adm.side_effect
        if facts.side_effect_expression is None or adm.stage != "class":
            history_class = side_effect
        layered = bool(get("layers"))
        if layered and recorded_class in SIDE_EFFECTS:
            # (narrowed: its class in the run — history, the budgets that counted it — is the recorded one)
            history_class = recorded_class
        reads = known.reads if known.reads is not None and known.reads_class == side_effect else None
        if reads is None:
            reads = known.reads = self._reads_of(tool, side_effect)
            known.reads_class = side_effect
        why = None if reads.plain else self._undecidable(tool, side_effect, args, run, redacted=_has_mark(args))
        if why is None and not run.started and self._reads_the_run(tool, side_effect):
            why = _RESUMED if run.resumed else _UNSTARTED
        if why is None and layered:
            why = _LAYERED
        if why is None and run.narrowed and (reads.seen or reads.history_class):
            why = _AFTER_LAYERED
        if why is None and (run.cost_unknown_in or self.cost_unknown_shared):
            why = self._reads_unknown_cost(run, reads)
        reservation = None
        new: str = "deny"
        new_rules: tuple[str, ...] = ()
        reason = ""
        budget: str | None = None
        if why is None and adm.decision is not None and adm.stage == "decided":
            try:
                # (no budget counts the (tool, class): the ledger would hold nothing, so it is not asked)
                reservation = run.ledger.reserve(tool, side_effect, adm.cost) if reads.budgeted else None
            except BudgetExceeded as exc:
                new, new_rules, reason, budget = "deny", adm.decision.rules, str(exc), exc.budget
            else:
                new, new_rules, reason, budget = (adm.decision.outcome, adm.decision.rules, adm.decision.reason,
                                                  None)
        elif why is None:  # refused by the policy, or before it (the class or cost could not be computed)
            decision = adm.decision
            new_rules = decision.rules if decision is not None else ()
            reason = decision.reason if decision is not None and adm.refusal is None else str(adm.refusal)
        if reservation is not None or why is not None or labels or self.keeps_history:
            # (else its outcome has nothing to settle, count, remember or add to `seen`)
            # (a narrowed call's cost was the highest of its policies': not known from here)
            run.pending[call_id] = (rec, reservation, history_class, labels, None if why is None else adm.cost,
                                    why is not None and (self._cost_unknown_of(reads, facts, args) or (
                                        layered and bool(self._reads_of(tool, history_class).cost_budgets))))
        if not counted:
            return
        sha = get("policy_sha256")
        if isinstance(sha, str):
            report.recorded_policies[sha] = report.recorded_policies.get(sha, 0) + 1
        seq = get("seq")
        seq = seq if isinstance(seq, int) else -1
        if why is not None:
            report.note_undecidable(Undecidable(seq, run_id, call_id, tool, why))
            return
        report.decided += 1
        if self.observe is not None:
            self.observe(adm, view, run.ledger, new, budget)
        # A call refused by a budget, or because its cost could not be computed, came to deny whatever its rules said.
        old_outcome = "deny" if refused_by is not _NOT_REFUSED or get("refused_at") == "cost" else old
        if new == old_outcome:
            report.unchanged += 1
            return
        rules = get("rules")
        old_rules = tuple(r for r in rules if isinstance(r, str)) if isinstance(rules, list) else ()
        ts_ns, old_text = self.clock.ns, str(old_outcome)
        report.count_change(f"{old_text}→{new}", new_rules, old_rules, budget, lambda: Change(
            seq, ts_ns, run_id, call_id, tool, _shown_args(rec), old_text, new, old_rules, new_rules, reason, budget))

    def _outcome(self, rec: Mapping[str, Any]) -> None:
        run_id, call_id = rec.get("run_id"), rec.get("call_id")
        if not (isinstance(run_id, str) and isinstance(call_id, str)):
            return
        run = self.runs.get(run_id)
        if run is None:
            return
        pending = run.pending.pop(call_id, None)
        if pending is None:
            return
        intent, reservation, side_effect, labels, as_happened, cost_unknown = pending
        status = rec.get("status")
        ran = status in RAN_STATUSES
        duration = rec.get("duration_ns")
        duration = duration if isinstance(duration, int) else 0
        if reservation is not None:
            if ran:
                run.ledger.settle(reservation, duration_ns=duration)
            else:
                run.ledger.release(reservation)
        elif as_happened is not None and ran:
            # Not decided again, but it ran: the budgets count it, as they did — the shared pools too (later
            # calls of every run read them), and where they would refuse it, the run's own at least.
            try:
                hold = run.ledger.reserve(intent["tool"], side_effect, as_happened)
            except BudgetExceeded:
                run.ledger.replay(intent["tool"], side_effect, as_happened, duration)
            else:
                run.ledger.settle(hold, duration_ns=duration)
            if cost_unknown:  # what those budgets hold of cost is not known from here on
                for name in self._reads_of(intent["tool"], side_effect).cost_budgets:
                    (self.cost_unknown_shared if name in self._shared_budgets else run.cost_unknown_in).add(name)
        if intent.get("layers"):
            run.narrowed = True
        if self.keeps_history:
            args = _recorded_args(intent)
            decision = intent.get("decision")
            run.history.append(HistoryEntry(
                intent["tool"], args, side_effect,
                decision if decision in ("allow", "deny", "require_approval") else "deny",
                status if isinstance(status, str) else "denied", labels))  # type: ignore[arg-type]
            if not run.history_redacted and isinstance(args, dict) and _has_mark(args):
                run.history_redacted = True
        if ran and labels and not run.seen.issuperset(labels):
            run.seen.update(labels)
            run.seen_sorted = tuple(sorted(run.seen))

    # -- what the log cannot answer ---------------------------------------------------------------

    def _undecidable(self, tool: str, side_effect: str, args: Mapping[str, Any], run: _Run,
                     *, redacted: bool) -> str | None:
        reads = self._reads_of(tool, side_effect)
        if reads.nothing and not redacted and not reads.cost_unknown:  # most calls: nothing to look at
            return None
        if not reads.nothing:
            if reads.provenance:
                return "a condition reads where values came from (provenance): the log holds no tool results"
            if reads.model_usage:
                return _MODEL_USAGE
            if redacted:
                hidden = _redacted_fields(args)
                if reads.args is None or not reads.args.isdisjoint(hidden):
                    return "a condition reads a redacted argument"
            if run.history_redacted and reads.history_args:
                return "a condition reads an earlier call's arguments, some of them redacted"
        if redacted:
            hidden = _redacted_fields(args)
            for expression in self._expressions(tool):
                if expression is None or not expression.isdisjoint(hidden):
                    return "the tool's side_effect or cost expression reads a redacted argument"
        if reads.cost_unknown:
            return "a cost budget counts this tool and the policy declares no cost for it (not in the log)"
        return None

    def _reads_of(self, tool: str, side_effect: str) -> _Reads:
        key = (tool, side_effect)
        found = self._reads.get(key)
        if found is None:
            rules = self.policy.candidates(tool, side_effect).all
            conditions = [r.condition for r in rules if r.condition is not None]
            args: frozenset[str] | None = frozenset()
            history_args = provenance = False
            for condition in conditions:
                needs = needs_of(condition.source, VARIABLES)
                if "args" in needs and args is not None:
                    fields = needs["args"]
                    args = None if fields is None else args | fields
                if "history" in needs:
                    entry = needs["history"]
                    history_args = history_args or entry is None or "args" in entry
                if PROVENANCE_FUNCTIONS.intersection(condition.functions) or any(
                        name in condition.source for name in ("provenance(", "from_user(")):
                    provenance = True
            cost_unknown = self._cost_unknown_for(tool, side_effect)
            plain = not conditions and not cost_unknown and not self._expressions(tool)
            counting = [b for b in self.policy.budgets if _matches(b.match, tool, side_effect)]
            usage: frozenset[str] | None = frozenset()
            reads_seen = reads_class = model_usage = False
            for condition in conditions:
                needs = needs_of(condition.source, VARIABLES)
                read = needs.get("usage", frozenset())
                usage = None if read is None or usage is None else usage | read
                if read != frozenset() and not model_usage:  # (decided only where no model field can be read)
                    fields = selected_subfields(condition.source, "usage")
                    model_usage = fields is None or not fields.isdisjoint(_MODEL_FIELDS)
                reads_seen = reads_seen or needs.get("seen", frozenset()) != frozenset()
                entry = needs.get("history", frozenset())
                reads_class = reads_class or entry is None or "side_effect" in entry
            found = self._reads[key] = _Reads(args, history_args, provenance, not conditions, cost_unknown, plain,
                                              bool(counting), usage,
                                              frozenset(b.name for b in counting if b.limit.cost is not None),
                                              reads_seen, reads_class, model_usage)
        return found

    def _cost_unknown_of(self, reads: _Reads, facts: ToolFacts, args: Mapping[str, Any]) -> bool:
        """Whether the log cannot give the cost an undecidable call counts at: the policy declares none for its
        tool, or computes it from arguments some of which are redacted."""
        if not reads.cost_budgets:
            return False
        return reads.cost_unknown or (facts.cost_expression is not None and _has_mark(args))

    def _reads_unknown_cost(self, run: _Run, reads: _Reads) -> str | None:
        """Why a call whose decision reads a budget holding a cost the log does not give is undecidable (a
        condition reading its usage, or the budget counting the call's cost), or None."""
        unknown = run.cost_unknown_in | self.cost_unknown_shared
        if reads.usage is None or not unknown.isdisjoint(reads.usage) or not unknown.isdisjoint(reads.cost_budgets):
            return ("a budget it reads or is counted by holds the cost of an earlier call the log cannot give "
                    "(undecidable too)")
        return None

    def _reads_the_run(self, tool: str, side_effect: str) -> bool:
        """Whether a call's decision can depend on its run (principal, labels, agent, earlier calls, budgets):
        a condition or expression naming one of them, or a budget counting the call."""
        key = (tool, side_effect)
        found = self._run_reads.get(key)
        if found is None:
            facts = facts_of(self.policy, tool, None, 0)
            sources = [r.condition.source for r in self.policy.candidates(tool, side_effect).all
                       if r.condition is not None]
            sources += [e.source for e in (facts.side_effect_expression, facts.cost_expression) if e is not None]
            found = self._run_reads[key] = any(_RUN_NAMES.search(source) for source in sources) or any(
                _matches(b.match, tool, side_effect) for b in self.policy.budgets)
        return found

    def _expressions(self, tool: str) -> list[frozenset[str] | None]:
        """The `args` fields the tool's side_effect and cost expressions read (None: all of them)."""
        found = self._expr_reads.get(tool)
        if found is None:
            facts = facts_of(self.policy, tool, None, 0)
            found = []
            for expression in (facts.side_effect_expression, facts.cost_expression):
                if expression is not None:  # compiled from the expanded source (`let:` names inlined)
                    needs = needs_of(expression.source, expression.variables)
                    if "args" in needs:
                        found.append(needs["args"])
            self._expr_reads[tool] = found
        return found

    def _cost_unknown_for(self, tool: str, side_effect: str) -> bool:
        key = (tool, side_effect)
        found = self._cost_unknown.get(key)
        if found is None:
            spec = self.policy.model.tools.get(tool)
            declared = spec is not None and spec.cost is not None
            counted = any(b.limit.cost is not None and _matches(b.match, tool, side_effect)
                          for b in self.policy.budgets)
            found = self._cost_unknown[key] = counted and not declared
        return found


_NOT_REFUSED: Any = object()
_NOT_RECORDED: Any = object()
#: Why a call of a run whose start the log does not hold is undecidable (its decision reads the run).
_UNSTARTED = ("the log does not hold the run's start (run_started): its principal, labels, earlier calls and "
              "budgets are not known")
#: Why a call of a run the log holds from a resumption only is undecidable (the calls before the pause are elsewhere).
_RESUMED = ("the log holds the run from its resumption (run_resumed), not its start (run_started): its earlier "
            "calls and budgets are not known")
#: Why a managed agent's call that its own policies narrowed is undecidable (the log has their fingerprints only).
_LAYERED = ("a managed agent's own policy decided it too (its facts, rules and budgets narrow the run's): the log "
            "names that policy by fingerprint only")
#: Why a call reading what a managed agent's narrowed call added to its run (`seen`, a class in history) is undecidable.
_AFTER_LAYERED = ("a condition reads seen or an earlier call's class, and a managed agent's own policy narrowed an "
                  "earlier call of the run (its labels and class were that policy's too)")
#: The variables of a condition that read the run rather than the call (by name: over-counting is safe).
_RUN_NAMES = re.compile(r"\b(?:run|history|seen|usage)\b")
#: The fields of `usage` a replay cannot give: the agent charges a model reply before the step's program runs,
#: while the log records the step's usage after its calls. A condition that reads `usage` is decided only when
#: every read names a field that is none of these (`selected_subfields`): a computed key, a macro over the
#: fields or a budget's usage passed whole may reach them.
_MODEL_FIELDS = frozenset({"model_tokens", "model_cost_usd"})
#: Why a call whose condition reads the model's usage is undecidable.
_MODEL_USAGE = ("a condition reads the model's usage (model_tokens, model_cost_usd): the log records a step's "
                "model usage after the step's calls, not what each call saw")


def _matches(match: Any, tool: str, side_effect: str) -> bool:
    from proctor.policy.matching import Matcher

    return Matcher.from_spec(match).matches(tool, side_effect)


def _recorded_args(intent: Mapping[str, Any]) -> dict[str, Any]:
    """A call's arguments as the gate decided them: its intent's, with canonical JSON's tags undone (a float
    is recorded as ``{"$float": "2.5"}``, bytes as ``{"$bytes": …}``: `proctor.canonical.untagged`)."""
    args = intent.get("args")
    if not isinstance(args, dict):
        return {}
    for value in args.values():  # (most calls' arguments are flat text and integers: nothing to undo)
        if type(value) is dict or type(value) is list:
            return cast("dict[str, Any]", untagged(args))
    return args


def _shown_args(intent: Mapping[str, Any]) -> dict[str, Any]:
    """A call's arguments as its intent records them (a report shows them as the log does)."""
    args = intent.get("args")
    return args if isinstance(args, dict) else {}


def _has_mark(node: Any) -> bool:
    """Whether `node` holds a redaction mark at any depth (iterative: a record's arguments may nest deeply)."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if REDACTED_MARK in item:
                return True
            stack.extend(v for v in item.values() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            stack.extend(v for v in item if isinstance(v, (dict, list)))
    return False


def _redacted_fields(args: Mapping[str, Any]) -> frozenset[str]:
    """The top-level argument names whose value holds a redaction mark (a nested path marks its head)."""
    return frozenset(k for k, v in args.items() if isinstance(v, (dict, list)) and _has_mark(v))


# -- reading logs ---------------------------------------------------------------------------------


def iter_log_records(source: str, bad: list[int] | None = None) -> Iterator[dict[str, Any]]:
    """The records of the audit log at `source` in order: a file path, or a ``postgresql://`` URL
    (exported by the sink's own reader, `proctor.audit.postgres.export_jsonl`). Lines that are
    not a record are skipped; with `bad` given, their count is added to ``bad[0]``."""
    with _log_file(source) as path:
        yield from _file_records(path, bad)


@contextmanager
def _log_file(source: str) -> Iterator[str]:
    """A JSON Lines file holding the log at `source`: itself, or a PostgreSQL log exported to a temporary one."""
    from proctor.audit.postgres import is_postgres_url

    if not is_postgres_url(source):
        yield source
        return
    import tempfile
    from pathlib import Path

    from proctor.audit.postgres import export_jsonl
    from proctor.audit.verify import side_file_path

    with tempfile.TemporaryDirectory(prefix="proctor-replay-") as tmp:
        path = Path(tmp) / "audit.jsonl"
        with path.open("wb") as out:  # with its last checkpoint beside it, as a file log keeps it (a cut tail)
            export_jsonl(source, out, side_file=side_file_path(path))
        yield str(path)


def log_failure(path: str, pubkey: PublicKeySource | None = None) -> str | None:
    """Where the audit log file at `path` first fails `proctor audit verify`'s checks (chain, checkpoints, side
    file; with `pubkey`, that its checkpoints are signed with that key), in words; None when it is intact."""
    from proctor.audit.verify import verify

    found = verify(path, pubkey=pubkey).failure
    if found is None:
        return None
    where = f"seq {found.seq}" + (f", line {found.line}" if found.line is not None else "")
    return f"{found.code} at {where}: {found.message}"


def _file_records(path: str, bad: list[int] | None, feed: Callable[[dict[str, Any]], None] | None = None
                  ) -> Iterator[dict[str, Any]]:
    """Each record of the file (lines read by `proctor.audit.lines.iter_line_batches`, which never holds a
    line over the log's line limit); with `feed`, each is handed to it instead (one generator step less per
    record)."""
    from proctor.audit.lines import iter_line_batches

    try:
        import orjson

        loads: Any = orjson.loads
    except ImportError:  # pragma: no cover - orjson is a dependency
        loads = json.loads
    skipped = 0
    with open(path, "rb") as f:
        for batch in iter_line_batches(f):
            for raw in batch:
                if raw.__class__ is not bytes:
                    skipped += 1
                    continue
                try:
                    value = loads(raw)
                except (ValueError, RecursionError):
                    skipped += 1
                    continue
                if value.__class__ is not dict:
                    skipped += 1
                elif feed is not None:
                    feed(value)
                else:
                    yield value
    if bad is not None:
        bad[0] += skipped


def replay(policy: Policy, records: Iterable[Mapping[str, Any]], *, since_ns: int | None = None,
           observe: Observer | None = None) -> ReplayReport:
    """Decide every recorded call in `records` (an audit log's records, in order) again under `policy`.

    Calls recorded before `since_ns` (ns since the epoch) still shape their runs' history and
    budgets but are not counted. `observe` is told of each call decided again (coverage uses it).
    """
    replayer = _Replayer(policy, since_ns, observe)
    feed = replayer.feed
    for rec in records:
        feed(rec)
    return replayer.report


def replay_log(policy: Policy, source: str, *, since_ns: int | None = None,
               observe: Observer | None = None, verify: bool = True,
               pubkey: PublicKeySource | None = None) -> ReplayReport:
    """`replay` over the audit log at `source` (a path or a ``postgresql://`` URL).

    With `verify` (the default) the log is first checked as `proctor audit verify` checks it, and the report
    says whether it is intact (`log_intact`, `log_failure`): a record edited, deleted or moved is otherwise
    read as written, and a replay of a doctored log would vouch for it. `pubkey` (the log writer's public key)
    also pins who signed its checkpoints: a chain rewritten whole and signed with another key fails.
    """
    replayer = _Replayer(policy, since_ns, observe)
    bad = [0]
    with _log_file(source) as path:
        if verify:  # (the same file replayed below: a PostgreSQL log is exported once, for both)
            replayer.report.log_failure = failure = log_failure(path, pubkey)
            replayer.report.log_intact = failure is None
        for _ in _file_records(path, bad, replayer.feed):  # (fed, not yielded)
            pass
    replayer.report.bad_lines = bad[0]
    return replayer.report
