"""The gate: the one door between generated code and real tools.

Every call — from a sandboxed program's stub, the tool-calling agent or a user's own
code — goes through `Gate.submit`, in this order, and nothing else runs a tool:

    admit (tool, facts, arguments, class, decision, cost: `proctor.policy.admission`)
        → halts → reserve budgets → approval (if required) → audit intent (durable)
        → execute → audit outcome → settle budgets

Each call is decided by one policy, whole (a reloading gate's current one, or the one its
run is pinned to); a shadow policy, when given, admits it beside and never acts. A call that
would pass a budget is refused before any human is asked; a call whose intent cannot be
recorded does not run. Every record and ending is written by `proctor.gate.recorder`.
`submit` never raises: it returns a `CallOutcome` whose `error` is the refusal or failure,
so callers across a process boundary can forward it. `call` is the raising convenience.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from opentelemetry.context import Context
from opentelemetry.trace import NoOpTracer, Tracer

from proctor.approval.base import Approver
from proctor.audit.base import AuditSink
from proctor.calls import (
    STATUSES,
    CallPosition,
    CallRecord,
    Decision,
    RunInfo,
    SideEffect,
    new_id,
    side_effect_rank,
)
from proctor.errors import (
    AuditError,
    BudgetExceeded,
    CallRefused,
    ConfigurationError,
    ProctorError,
    ToolDenied,
    ToolFailed,
    ToolOutcomeUnknown,
)
from proctor.gate.approval import ApprovalStep
from proctor.gate.budgets import FollowingLedger
from proctor.gate.call import CallOutcome, CallScope, InFlight
from proctor.gate.recorder import Recorder, log_fields, safely
from proctor.gate.run import DEFAULT_HISTORY_LIMIT, Ledger, RunContext
from proctor.gate.shadow import Shadow
from proctor.halt import (
    Halt,
    HaltChannel,
    HaltEvent,
    HaltsAt,
    JointHalts,
    Scope,
    SharesHalts,
    halt_refusal,
    new_halt,
)
from proctor.halt.shared import default_halts, shared_halts
from proctor.interrupts import interruption
from proctor.ledger.base import SharedLedger
from proctor.ledger.opening import open_ledger
from proctor.ledger.scope import ledger_scope
from proctor.policy.admission import AdmissionPolicy, admit, facts_of
from proctor.policy.aggregates import Pipeline
from proctor.policy.approvers import ApproverRule, OsUser
from proctor.policy.engine import Policy, ToolFacts
from proctor.policy.reload import PolicyChange, PolicySource
from proctor.provenance import USER, ProvenanceIndex, ProvenanceLimits, ResultLabeller
from proctor.redaction import Redacted, secret_values
from proctor.telemetry import metrics
from proctor.telemetry import semconv as sc
from proctor.telemetry.logging import get_logger
from proctor.telemetry.spans import QuietSpan, ToolSpan, get_tracer, tool_span
from proctor.tools import Tool, as_tool

if TYPE_CHECKING:
    from proctor.policy.schema import PolicyModel

__all__ = ["CallOutcome", "CallScope", "Gate", "RunContext"]

log = get_logger("proctor.gate")
ProctorErrorT = TypeVar("ProctorErrorT", bound=ProctorError)



class _ApprovalSettings(Protocol):
    @property
    def timeout_s(self) -> float: ...
    #: Who may answer a call decided by these rules (`proctor.policy.approvers`).
    def approvers_for(self, rules: Sequence[str]) -> tuple[ApproverRule, ...]: ...
    @property
    def os_users(self) -> Mapping[str, OsUser]: ...
    @property
    def tokens(self) -> str | None: ...


class PolicyLike(AdmissionPolicy, Protocol):
    """What the gate needs of a policy, all of it; `proctor.Policy` is one. Deciding a call is
    admission's (`proctor.policy.admission.AdmissionPolicy`); the rest is what runs are built with."""

    @property
    def approval(self) -> _ApprovalSettings: ...
    #: One line for a model's system prompt saying what the policy does with `tool` (an agent's prompts).
    def describe_tool(self, tool: str, side_effect: SideEffect | None = None) -> str: ...
    #: The history pipelines its conditions read, folded per run as calls happen (`RunContext.track`).
    @property
    def pipelines(self) -> tuple[Pipeline, ...]: ...
    #: Whether a condition calls provenance()/from_user(): runs then keep a provenance index.
    @property
    def uses_provenance(self) -> bool: ...
    #: Every label the policy gives tools' results.
    @property
    def result_labels(self) -> tuple[str, ...]: ...
    def new_ledger(self, run: RunInfo | None = None, shared: SharedLedger | None = None) -> Ledger: ...
    def result_sources(self, tool: str) -> ResultLabeller | None: ...
    @property
    def model(self) -> PolicyModel: ...  # the file's settings: `ledger:` (ledger_scope), `sandbox:` (Interpreter)


def _candidate(shadow: PolicyLike | str | os.PathLike[str]) -> PolicyLike:
    """`shadow=`: a policy, or a policy file's path loaded now (a bad file raises its located `PolicyError` before
    any run). Plain data is refused here, when the gate is made, rather than failing the first run it starts."""
    if isinstance(shadow, (str, os.PathLike)):
        return Policy.from_yaml(shadow)
    if isinstance(shadow, (Mapping, bytes, int, float, list, tuple)):
        raise ConfigurationError(f"shadow= takes a Policy (Policy.from_yaml(path), Policy.from_dict(data)) or a "
                                 f"policy file's path, not a {type(shadow).__name__}")
    return shadow


class Gate:
    """The single choke point every tool call goes through (see the module docstring)."""

    def __init__(
        self,
        policy: PolicyLike | PolicySource | str | os.PathLike[str],
        *,
        approver: Approver | None = None,
        audit: AuditSink | None = None,
        tracer: Tracer | None = None,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        history_limit: int = DEFAULT_HISTORY_LIMIT,
        ledger: SharedLedger | str | None = None,
        provenance_limits: ProvenanceLimits | None = None,
        shadow: PolicyLike | str | os.PathLike[str] | None = None,
        halts: HaltChannel | None = None,
    ) -> None:
        #: The one writer of the gate's audit records and of its calls' endings.
        self.recorder = Recorder(audit)
        # A policy file is reloaded when it changes (and on SIGHUP where installed): `proctor.policy.reload`.
        self._source: PolicySource | None = None
        self._static: PolicyLike | None = None
        if isinstance(policy, (str, os.PathLike)):
            policy = PolicySource(policy)
        if isinstance(policy, PolicySource):
            self._source = policy
            self._chain_reload_callbacks(policy)
        else:
            self._static = policy
        # Budgets shared between runs (per principal, label, global): this process's, or Redis's.
        self.ledger = open_ledger(ledger)
        # Every halt that starts or ends on the channel is recorded here (`halt_set`, `halt_lifted`), however
        # it came (this gate's API, another's, a signal, another process on the shared backend), once: the ids of
        # the halts its trail records as set (`_first_news_of`; `halt` records its own), and of the lifts
        # `lift_halt` records itself, whose telling by the channel is then not a second record.
        self._halts_known: set[str] = set()
        self._lifts_recorded: set[str] = set()
        self._halts_lock = threading.Lock()
        #: Halts this gate honours: the channel given, else this process's (`gate_halts`) joined with those of
        #: the backends it shares (its Redis ledger's; `honour_halts_of` adds a run store's): `proctor.halt.shared`.
        self.halts: HaltChannel
        self._halts_given = halts is not None
        self._halts_from: set[HaltsAt] = set()  # the shared backends whose halts joined the default channel
        if halts is not None:
            self.halts = halts
            halts.watch(self._on_halt)  # held weakly by the channel: it does not keep this gate alive
        else:
            self.halts = default_halts(self.ledger, listener=self._on_halt)
            if isinstance(self.ledger, SharesHalts):
                self._halts_from.add(self.ledger.halts_at)
        self._record_in_force(self.halts)
        #: Caps of each run's provenance index (kept only when the policy calls provenance()/from_user()).
        self.provenance_limits = provenance_limits or ProvenanceLimits()
        #: Calls of a run whose raw history entries and records are kept (see `RunContext`).
        self.history_limit = history_limit
        self.ledger_scope = ledger_scope(self.policy.model, self.ledger, ledger)  # cross-run budgets: shared, or local
        # (checked again for each run started under a reloaded policy: `_check_scope`)
        self._ledger_asked, self._scope_of = ledger, self.policy.sha256
        self._scoped = {self._scope_of}  # the policies whose cross-run budgets passed that check (`_follow`)
        self.approver = approver
        self.tracer = get_tracer(tracer)
        #: The approval step of calls the policy sends to a human (or a grant).
        self.approvals = ApprovalStep(self)
        #: A candidate policy deciding every call beside `policy`, never acting (`proctor.gate.shadow`).
        self.shadow = (Shadow(_candidate(shadow), self.recorder, self.provenance_limits) if shadow is not None
                       else None)
        self.tools: dict[str, Tool] = {}
        self._default_context: RunContext | None = None
        self._lock = threading.Lock()
        self.register(*tools)

    @property
    def audit(self) -> AuditSink | None:
        """The audit sink the gate's records go to (None: none kept)."""
        return self.recorder.audit

    @property
    def policy(self) -> PolicyLike:
        """The policy in force now (a reloading gate's current one)."""
        if self._source is not None:
            return self._source.current()
        assert self._static is not None
        return self._static

    @policy.setter
    def policy(self, policy: PolicyLike) -> None:
        self._source, self._static = None, policy

    def policy_for(self, ctx: RunContext) -> PolicyLike:
        """The policy that decides the next call of run `ctx`: the current one, or the one the run started
        with when the policy says `reload: new_runs`. One call is decided by one policy, whole."""
        if self._source is not None:
            return self._source.for_run(ctx.info.id)
        assert self._static is not None
        return self._static

    def _check_scope(self) -> None:
        """A reloaded policy's cross-run budgets get the check the first policy got at the gate's start: a
        run is not started on a process-local ledger the new policy did not ask for (ConfigurationError)."""
        policy = self.policy
        if policy.sha256 != self._scope_of:
            self.ledger_scope = ledger_scope(policy.model, self.ledger, self._ledger_asked)
            self._scope_of = policy.sha256

    def _run_ledger(self, policy: PolicyLike, info: RunInfo) -> Ledger:
        """A run's budgets: its policy's; a reloading gate's follow the policy that decides each call."""
        if self._source is not None:
            return FollowingLedger(policy, info, self.ledger)
        return policy.new_ledger(info, self.ledger)

    def _follow(self, ctx: RunContext, policy: PolicyLike) -> None:
        """Count run `ctx`'s calls on `policy`'s budgets from this call on (a reloaded policy decides it whole).
        Its cross-run budgets get the check a run's start gives them (ConfigurationError, saying the fix)."""
        if policy.sha256 not in self._scoped:
            ledger_scope(policy.model, self.ledger, self._ledger_asked)
            self._scoped.add(policy.sha256)
        ctx.follow_policy(policy)

    def _chain_reload_callbacks(self, source: PolicySource) -> None:
        """Record each change of the policy file in the audit log (`policy_changed`), after the source's own."""
        theirs = source.on_change

        def changed(change: PolicyChange) -> None:
            if theirs is not None:
                try:
                    theirs(change)
                except Exception as exc:  # noqa: BLE001 - the change happened: it is recorded whatever they raise
                    log.error("policy_reload_listener_failed", path=change.path, error=repr(exc))
            self.recorder.append("policy_changed", {"path": change.path, "old_sha256": change.old_sha256,
                                                    "new_sha256": change.new_sha256}, durable=True)

        source.on_change = changed

    # -- halts ----------------------------------------------------------------------------------

    def honour_halts_of(self, backend: SharesHalts) -> None:
        """Also honour the halts kept by `backend`, one this gate's runs share (a SQL run store: an agent's
        `store=` calls it), so that `proctor halt --store URL` stops them. Not for a gate given `halts=`: it
        honours exactly the channel it was given."""
        self.honour_halts_at(backend.halts_at)

    def honour_halts_at(self, at: HaltsAt) -> None:
        """`honour_halts_of` for the backend named by `at` (`proctor.halt.shared.halts_at(url)`: a command line
        given a store's URL)."""
        if self._halts_given:
            return
        with self._halts_lock:
            if at in self._halts_from:
                return
            self._halts_from.add(at)
            current = self.halts.channels if isinstance(self.halts, JointHalts) else (self.halts,)
            joined = shared_halts(at, self._on_halt)
            self.halts = JointHalts(*current, joined)
        self._record_in_force(joined)

    def halt(self, reason: str, *, scope: Scope = "all", value: str | None = None, by: str | None = None) -> Halt:
        """Halt matching calls on every gate sharing this gate's halt channel (`proctor.halt`), now.

        ``gate.halt("incident 42", scope="tool", value="send_email")``. `by` defaults to the OS user.
        The halt is set first and recorded (`halt_set`) second — stopping calls is never the dangerous
        direction: if the record cannot be written, the halt stays in force and `AuditError` says so.
        """
        halt = new_halt(scope, value, reason, by)
        with self._halts_lock:
            self._halts_known.add(halt.id)
        self.halts.backend.set(halt)
        fields = HaltEvent("halt_set", halt, halt.by, halt.reason, "api").audit_fields()
        try:
            self.recorder.append("halt_set", {**fields, "backend": self.halts.backend.shown}, required=True)
        except AuditError as exc:
            raise AuditError(f"halt {halt.id} IS IN FORCE but {exc}; lift it with gate.lift_halt({halt.id!r}, …) "
                             "once the trail is writable, or record it by hand") from None
        return halt

    def lift_halt(self, halt_id: str, reason: str, *, by: str | None = None) -> Halt:
        """End halt `halt_id` on this gate's channel. Recorded first (`halt_lifted`, who and why): a lift that
        cannot be recorded does not happen (`AuditError`); `HaltError` when no such halt is active."""
        from proctor.halt import HaltError, operator

        if not reason.strip():
            raise HaltError("a lift needs its reason: the audit trail keeps it")
        found = {h.id: h for h in self.halts.backend.list_halts()}.get(halt_id)
        if found is None:
            raise HaltError(f"no active halt {halt_id!r} on {self.halts.backend.shown}")
        who = by if by is not None else operator()
        fields = HaltEvent("halt_lifted", found, who, reason, "api").audit_fields()
        with self._halts_lock:
            self._lifts_recorded.add(halt_id)
        try:
            self.recorder.append("halt_lifted", {**fields, "backend": self.halts.backend.shown}, required=True)
        except AuditError:
            with self._halts_lock:
                self._lifts_recorded.discard(halt_id)
            raise
        return self.halts.backend.lift(halt_id, reason=reason, by=who)

    def _halted(self, tool: str, ctx: RunContext) -> Halt | None:
        """The halt stopping a call of `tool` in run `ctx`, if any. A managed agent's call is also its parents'
        work: a halt of any agent in the chain (`ctx.agents`) stops it, not only one of the agent making it."""
        info = ctx.info
        halt = self.halts.check(tool, info.agent, info.principal, info.id)
        if halt is None:
            for agent in ctx.agents:
                if agent != info.agent:
                    halt = self.halts.check(tool, agent, info.principal, info.id)
                    if halt is not None:
                        break
        return halt

    def _record_in_force(self, channel: HaltChannel) -> None:
        """Record the halts `channel` already holds as this gate starts honouring them: the channel tells only of
        halts that start or end from now on, and the trail would name, in the calls they refuse, halts it never
        recorded (and later record their lifting alone)."""
        for halt in channel.active():
            if self._first_news_of(halt.id):
                self.recorder.append("halt_set", HaltEvent("halt_set", halt, halt.by, halt.reason,
                                                           "in force when this gate started").audit_fields())

    def _first_news_of(self, halt_id: str) -> bool:
        """Whether this gate's trail has not recorded halt `halt_id` as set yet (and now counts it recorded): a
        halt read while the gate starts is both in force and news from its channel, and is recorded once."""
        with self._halts_lock:
            if halt_id in self._halts_known:
                return False
            self._halts_known.add(halt_id)
            return True

    def _on_halt(self, event: HaltEvent) -> None:
        """Record a halt the channel saw start or end (unless `halt`/`lift_halt` of this gate recorded it)."""
        if event.kind == "halt_set":
            if not self._first_news_of(event.halt.id):
                return
        else:
            with self._halts_lock:
                if event.halt.id in self._lifts_recorded:
                    self._lifts_recorded.discard(event.halt.id)
                    return
        self.recorder.append(event.kind, event.audit_fields())

    # -- set-up ---------------------------------------------------------------------------------

    def register(self, *tools: Tool | Callable[..., Any]) -> None:
        """Make tools callable through this gate; a name already taken by another tool is an error."""
        for item in tools:
            t = as_tool(item)
            existing = self.tools.get(t.name)
            if existing is not None and existing is not t and existing.fn is not t.fn:
                raise ConfigurationError(f"a different tool named {t.name!r} is already registered")
            self.tools[t.name] = t

    def start_run(
        self, *, principal: str | None = None, labels: Mapping[str, str] | None = None, run_id: str | None = None,
        task: str | None = None, agent: str | None = None, provenance: bool = False,
    ) -> RunContext:
        """Open a run: fresh budgets and history. Refused (`AuditError`) if the audit trail cannot record it.

        `task` is what the user asked: when the policy calls `provenance()`/`from_user()`, it is
        indexed as the source ``user`` (the agents pass it themselves). `agent` names the agent
        running it (`run.agent` in conditions; managed agents it hands tasks to get their own name
        there, see `RunContext.delegate`). `provenance=True` keeps the run's provenance index even
        when this gate's policy reads none (a managed agent's own policy does).
        """
        info = RunInfo(id=run_id or new_id("run_"), principal=principal, labels=dict(labels or {}), agent=agent)
        # The policy the run starts with, pinned now: a `reload: new_runs` policy loaded before its first call
        # keeps it on this one, the one its run_started record names.
        policy = self._source.for_run(info.id) if self._source is not None else self.policy
        self._check_scope()
        ctx = RunContext(info, self._run_ledger(policy, info), history_limit=self.history_limit)
        if agent is not None:
            ctx.agents = (agent,)
        # The policy's history aggregates fold from the first call, so they outlive dropped entries.
        ctx.track(policy.pipelines)
        if self.shadow is not None:  # the candidate's too: it decides every call on the whole run's history
            ctx.track(self.shadow.policy.pipelines)
        ctx.provenance = self._provenance_index(task, provenance, policy)
        fields: dict[str, Any] = {"run_id": info.id, "principal": info.principal, "labels": dict(info.labels),
                                  "policy_sha256": policy.sha256, **self.ledger_scope.audit_fields}
        if agent is not None:
            fields["agent"] = agent
        started = self.recorder.append("run_started", fields, required=True)
        ctx.audit_start = ctx.opened_seq = started.seq if started is not None else None
        if self.shadow is not None:  # the candidate's own provenance index starts from the task
            self.shadow.started(ctx, task)
        return ctx

    def resume_run(self, info: RunInfo, *, task: str | None = None, provenance: bool = False,
                   **fields: Any) -> RunContext:
        """Reopen a durable run saved earlier (fresh ledger and history, for the caller to restore).

        Recorded as `run_resumed` (with the resuming process's host and pid); refused (`AuditError`)
        if the audit trail cannot record it. The results of calls made before the pause are not in
        the new provenance index: it counts them as unseen content of every label the policy gives
        tools (fail safe:
        `provenance()` then includes those labels for every value; `from_user` still reads `task`).
        """
        # The policy the resumed run goes on with, pinned now as `start_run` pins a new run's: one ask for the
        # ledger, the index and the record (a `reload: new_runs` policy keeps the run on the one its record names).
        policy = self._source.for_run(info.id) if self._source is not None else self.policy
        ctx = RunContext(info, self._run_ledger(policy, info))
        ctx.provenance = self._provenance_index(task, provenance, policy)
        if ctx.provenance is not None:
            ctx.provenance.mark_incomplete(policy.result_labels)
        # The resume is its own fact, apart from the answer that allowed it: its time (the record's
        # ts_ns) and the process that resumed (host, pid), which need not be the one that suspended.
        resumed = self.recorder.append("run_resumed", {"run_id": info.id, "principal": info.principal,
                                             "labels": dict(info.labels), "step": info.step + 1,
                                             "policy_sha256": policy.sha256, "host": socket.gethostname(),
                                             "pid": os.getpid(), **fields,
                                             **self.ledger_scope.audit_fields}, required=True)
        ctx.opened_seq = resumed.seq if resumed is not None else None
        if self.shadow is not None:
            self.shadow.started(ctx, task, resumed=True)
        return ctx

    def suspend_run(self, ctx: RunContext, pending: Iterable[str], **fields: Any) -> None:
        """Record that a run stopped to wait for the approvals `pending` (ids in the run store)."""
        self.recorder.append("run_suspended", {"run_id": ctx.info.id, "step": ctx.info.step, "pending": list(pending),
                                               **fields})

    def finish_run(self, ctx: RunContext, status: str = "done", *, taken_over: bool = False, **fields: Any) -> None:
        """Close a run in the audit trail.

        `taken_over`: this process stops working on the run because another took it over (`RunTakenOver`): not an
        ending of the run. The record says so (``taken_over: true``) with the seq of the record that opened this
        process's work on it (``opened_seq``): a verifier takes it for a takeover only when the log holds another
        process's `run_resumed` after that one (`proctor.store.trail`), never on the store's word alone."""
        summary: dict[str, int] = dict.fromkeys(STATUSES, 0)
        for ended, count in ctx.status_counts.items():
            summary[ended] = summary.get(ended, 0) + count
        if taken_over:
            fields = {**fields, "taken_over": True, "opened_seq": ctx.opened_seq}
        self.recorder.append("run_finished", {"run_id": ctx.info.id, "status": status, "calls": summary, **fields})
        if self.shadow is not None:
            self.shadow.finished(ctx.info.id)
        if self._source is not None:
            self._source.end_run(ctx.info.id)

    def _provenance_index(self, task: str | None, wanted: bool, policy: PolicyLike) -> ProvenanceIndex | None:
        """A run's index of where values came from, when its policy reads it (else None: no cost). A shadow that
        reads it keeps one of its own, by the candidate's labels (`proctor.gate.shadow`)."""
        if not (wanted or policy.uses_provenance):
            return None
        index = ProvenanceIndex(self.provenance_limits)
        if task:
            index.add(task, (USER,))
        return index

    def _late_index(self, ctx: RunContext, policy: PolicyLike) -> ProvenanceIndex:
        """The index of a run that started without one, for a policy reloaded since that reads provenance.
        What the run's calls returned before now was never indexed: it counts as unseen content of every label
        the policy or the run's calls gave (fail safe, as a resumed run's: `provenance()` then includes those
        labels for every value), and the task is not in it (`from_user` finds nothing)."""
        index = ProvenanceIndex(self.provenance_limits)
        if ctx.calls_made:
            index.mark_incomplete({*policy.result_labels, *ctx.seen_labels()})
        return index

    def _index_result(self, p: InFlight, value: Any, error: ProctorError | None) -> None:
        """Index what a labelled tool returned (its value, or its error's text) under its labels.

        Called before the result reaches the caller, so the next call's decision sees it. A
        failure here marks the labels as not fully indexed (provenance then errs towards them).
        """
        index, labels = p.ctx.provenance, p.facts.labels
        if index is None or not labels:
            return
        try:
            # Labels by field path and by call where the policy gives them (`sources:`), else the tool's.
            index.add_result(str(error) if error is not None else value, labels, p.policy.result_sources(p.name),
                             p.args, tool=p.name)
        except Exception as exc:  # noqa: BLE001 - the call has run; its provenance must fail safe, not crash it
            log.error("provenance_index_failed", tool=p.name, error=repr(exc), **log_fields(p.span))
            index.mark_incomplete(labels)

    def default_context(self) -> RunContext:
        """The run used by calls made without a context (one per gate)."""
        with self._lock:
            if self._default_context is None:
                self._default_context = self.start_run()
            return self._default_context

    # -- calling --------------------------------------------------------------------------------

    def call(
        self,
        tool: Tool | str,
        args: Mapping[str, Any] | None = None,
        *,
        context: RunContext | None = None,
        call_id: str | None = None,
        parent: Context | None = None,
    ) -> Any:
        """Run one governed call and return its result, or raise why it did not run or failed."""
        return self.submit(tool, args, context=context, call_id=call_id, parent=parent).unwrap()

    async def acall(
        self,
        tool: Tool | str,
        args: Mapping[str, Any] | None = None,
        *,
        context: RunContext | None = None,
        call_id: str | None = None,
        parent: Context | None = None,
    ) -> Any:
        """`call` for async code: the gate's steps (which may wait on a human) run off the event loop."""
        outcome = await asyncio.to_thread(
            self.submit, tool, args, context=context, call_id=call_id, parent=parent
        )
        return outcome.unwrap()

    def submit(
        self,
        tool: Tool | str,
        args: Mapping[str, Any] | None = None,
        *,
        context: RunContext | None = None,
        call_id: str | None = None,
        parent: Context | None = None,
        on_result: Callable[[Any, ProctorError | None], None] | None = None,
        position: CallPosition | None = None,
    ) -> CallOutcome:
        """Run one governed call; never raises an `Exception`. See the module docstring for the steps.

        `position`, when given, is where the program made the call (`proctor.Interpreter` reports it):
        an approver is shown that place, and the `approval_requested` record names it.

        `on_result`, when given, is called with the tool's value and error (a `ToolFailed`, or
        None) as soon as the tool returns, before its outcome is recorded: a caller in another
        process gets its answer while the gate writes the outcome. It is not called for a call
        that did not run; the returned `CallOutcome` says why. Whatever it raises is logged.

        A `KeyboardInterrupt` or `SystemExit` (Ctrl-C, SIGTERM) is recorded — the call ends
        `unknown` if the tool had started, `cancelled` if it had not — and then raised again.
        """
        call_id = call_id or new_id("call_")
        name = tool.name if isinstance(tool, Tool) else str(tool)
        try:
            ctx = context or self.default_context()
        except Exception as exc:  # noqa: BLE001 - no run to record the call in: refuse it, unrecorded
            log.error("gate_no_run", tool=name, error=repr(exc))
            error = AuditError(f"{name}: refused, no run could be opened for the call: {exc}")
            record = CallRecord(call_id, name, {}, "destructive", None, "denied", 0, str(error), "AuditError")
            return CallOutcome(record, None, error)
        seq = -1
        journal = ctx.journal
        if journal is not None:  # a durable run: the call's id is its place in the step, the same on resume
            seq = journal.take()
            call_id = journal.call_id(seq)
        opened: tool_span | None = None
        span: ToolSpan
        if metrics.quiet(self.tracer):  # nothing would receive a span (QuietSpan)
            span = QuietSpan(name, call_id, ctx.info.id)  # its own context manager, a no-op
        else:
            opened = self._open_span(name, call_id, ctx, parent)
            span = opened.__enter__()
        policy = self.policy_for(ctx)
        p = InFlight(name, call_id, ctx, span, started_ns=time.perf_counter_ns(), policy=policy,
                     on_result=on_result, journal=journal, seq=seq, position=position)
        raised: BaseException | None = None
        try:
            try:
                outcome = self._walk(p, tool, args)
            except Exception as exc:  # noqa: BLE001 - the gate must never crash its caller: end by state
                log.error("gate_internal_error", tool=name, state=p.state, error=repr(exc), **log_fields(p.span))
                outcome = self._end_by_state(p, exc)
            except BaseException as exc:  # Ctrl-C, SIGTERM: record how the call ended, then let it through
                raised = exc
                self._end_interrupted(p, exc)
                raise
            if p.shadow is not None and self.shadow is not None:
                # The call is answered (a program's got its reply in on_result): now the candidate decides it.
                self.shadow.ended(p, ran=outcome.record.status not in ("denied", "cancelled"))
            return outcome
        finally:
            if opened is not None:
                try:
                    opened.__exit__(type(raised) if raised else None, raised, None)
                except Exception as exc:  # noqa: BLE001 - an exporter that raises does not change the call
                    log.error("span_end_failed", tool=name, error=repr(exc))

    def refuse(
        self,
        tool: str,
        reason: str,
        *,
        context: RunContext | None = None,
        call_id: str | None = None,
        parent: Context | None = None,
        args_sha256: str | None = None,
        args_bytes: int | None = None,
    ) -> CallOutcome:
        """Record and refuse a call whose arguments its caller would not hand over (over a size limit,
        refused before they were decoded): intent and `denied` outcome without the arguments, with
        their size and a keyed digest of their sha256. Never raises an `Exception`."""
        call_id = call_id or new_id("call_")
        try:
            ctx = context or self.default_context()
        except Exception as exc:  # noqa: BLE001 - no run to record it in: refuse, unrecorded
            log.error("gate_no_run", tool=tool, error=repr(exc))
            record = CallRecord(call_id, tool, {}, "destructive", None, "denied", 0, reason, "ToolDenied")
            return CallOutcome(record, None, ToolDenied(reason, tool=tool, call_id=call_id))
        opened = self._open_span(tool, call_id, ctx, parent)
        p = InFlight(tool, call_id, ctx, opened.__enter__(), started_ns=time.perf_counter_ns(),
                     policy=self.policy_for(ctx), journal=ctx.journal)
        try:
            known = (ctx.tools if ctx.tools is not None else self.tools).get(tool)
            if known is not None:
                p.tool = known
                # the tool's facts before any call (admission's): the arguments were never read
                p.facts = facts_of(p.policy, tool, known.side_effect, known.cost, ctx.layers)
                p.side_effect = p.facts.side_effect
            digest = self.recorder.redact({"sha256": args_sha256}, ()).digest if args_sha256 else None
            p.redacted = Redacted({}, digest or "")
            return self.recorder.refused(p, ToolDenied(reason, tool=tool, call_id=call_id),
                                         extra={"args_bytes": args_bytes,
                                                **({} if known is not None else {"refused_at": "tool"})})
        except Exception as exc:  # noqa: BLE001 - the call is refused whatever fails here
            log.error("gate_internal_error", tool=tool, state=p.state, error=repr(exc), **log_fields(p.span))
            record = CallRecord(call_id, tool, {}, "destructive", None, "denied", 0, reason, "ToolDenied")
            return CallOutcome(record, None, ToolDenied(reason, tool=tool, call_id=call_id))
        finally:
            try:
                opened.__exit__(None, None, None)
            except Exception as exc:  # noqa: BLE001 - an exporter that raises does not change the call
                log.error("span_end_failed", tool=tool, error=repr(exc))

    # -- the steps ------------------------------------------------------------------------------
    #
    # Each call walks these states, in order; `p.state` names the last one reached:
    #   new -> validated -> decided -> reserved -> approving -> authorized -> intent -> running -> ran -> done
    # A call ends ok | failed | timeout (the tool returned), denied (refused before the tool
    # started), unknown (the tool started, its result is not known) or cancelled (interrupted
    # before the tool started). Once `running` is reached a call never ends `denied`.

    def _walk(self, p: InFlight, tool: Tool | str, raw_args: Mapping[str, Any] | None) -> CallOutcome:
        name = p.name
        ctx = p.ctx
        # The one decision (proctor.policy.admission); a managed agent's calls name its own tools.
        table = self.tools if ctx.tools is None else ctx.tools
        expected = tool if isinstance(tool, Tool) else None
        if self._source is not None:  # a reloaded policy decides the call whole: its budgets count it
            try:
                self._follow(ctx, p.policy)
            except ConfigurationError as exc:
                return self.recorder.refused(p, ToolDenied(f"{name}: refused: the policy now in force cannot be "
                                                           f"counted here: {exc}", tool=name, call_id=p.call_id))
        if ctx.provenance is None and p.policy.uses_provenance:  # reloaded into a run that started without it
            ctx.keep_provenance(lambda: self._late_index(ctx, p.policy))
        adm = admit(p.policy, name, raw_args, tools=table, run=ctx, layers=ctx.layers, expected=expected)
        shadow = self.shadow
        if shadow is not None:  # what this admission saw, for the candidate's (`proctor.gate.shadow`)
            shadow.admitted(p, raw_args, table, expected)
            if adm.stage != "decided":
                shadow.decided(p, adm)
        if adm.stage == "tool":
            # (kept in the run as the unknown worst case, whatever a policy says of that name: said so, for
            # whoever rebuilds the run from the log — `policy replay`)
            return self.recorder.refused(p, self._placed(p, adm.refusal), extra={"refused_at": "tool"})
        p.tool = cast(Tool, adm.tool)
        facts = p.facts = cast(ToolFacts, adm.facts)
        p.layer_facts = list(adm.layer_facts)
        p.side_effect = adm.side_effect if adm.stage == "args" else facts.side_effect
        span = p.span
        # Without an OpenTelemetry SDK (span not recording) the span setters do nothing but note the
        # decision for metrics, and cannot fail: they are skipped, or called without `_safely`.
        recording = span.recording
        if recording:
            safely(span.describe, p.tool.description)
            if p.tool.origin is not None:  # where the tool lives: an MCP server's `mcp:<name>`
                safely(span.span.set_attribute, "proctor.tool.origin", p.tool.origin)
        if facts.redact and raw_args and isinstance(raw_args, Mapping):
            # raw, so a refusal quoting the value (a validation error) is scrubbed too
            ctx.secrets.update(secret_values(raw_args, facts.redact))
        if adm.stage == "args":
            return self.recorder.refused(p, self._placed(p, adm.refusal))
        args = p.args = cast(dict[str, Any], adm.args)
        if p.journal is not None:  # a resumed step: calls made before the pause are answered from the journal
            replayed = p.journal.replay(self, p)
            if replayed is not None:
                if shadow is not None:  # decided when it first ran; the candidate's budgets count it, as the run's
                    shadow.replayed(p, replayed.record, counted=not p.journal.quiet)
                if ctx.provenance is not None:
                    self._index_result(p, replayed.value, replayed.error)
                return replayed
        p.redacted = self.recorder.redact(args, facts.redact)
        p.state = "validated"
        if recording:
            safely(span.arguments, p.redacted.args)
        if adm.stage == "class":
            return self.recorder.refused(p, self._placed(p, adm.refusal))
        p.side_effect = adm.side_effect
        decision = p.decision = cast(Decision, adm.decision)
        p.layer_votes = list(adm.votes)
        p.state = "decided"
        if recording:
            safely(span.decision, decision, p.side_effect)
        else:
            span.decision(decision, p.side_effect)
        if adm.stage == "policy":
            return self.recorder.refused(p, ToolDenied(f"{name}: denied: {decision.reason}", tool=name,
                                                       call_id=p.call_id, rules=decision.rules))
        if adm.stage == "cost":
            # The rules' decision is recorded, but the call was refused: said so, for whoever reads the log
            # again (`policy replay` compares a call by what it came to, as the shadow does).
            return self.recorder.refused(p, self._placed(p, adm.refusal), extra={"refused_at": "cost"})
        cost = p.cost = adm.cost
        halt = self._halted(name, ctx)
        if halt is not None:  # an operator stopped it (`proctor halt`): refused, naming the halt
            if shadow is not None:  # (the policies are compared; the call did not go on)
                shadow.decided(p, adm)
            return self.recorder.refused(p, halt_refusal(name, halt, p.call_id), extra={"halt_id": halt.id})
        try:
            p.reservation = p.ctx.ledger.reserve(name, p.side_effect, cost)
        except BudgetExceeded as exc:
            exc.tool, exc.call_id, exc.rules = name, p.call_id, p.decision.rules
            self.recorder.about(p, "budget_exhausted", {"run_id": p.ctx.info.id, "call_id": p.call_id, "tool": name,
                                                        "budget": exc.budget, "reason": str(exc)})
            safely(p.span.event, sc.BUDGET_EXHAUSTED_EVENT, {sc.PROCTOR_BUDGET_NAME: exc.budget or "",
                                                              sc.PROCTOR_REASON: str(exc)})
            if shadow is not None:
                shadow.decided(p, adm, exc)
            return self.recorder.refused(p, exc)
        p.state = "reserved"
        if shadow is not None:
            shadow.decided(p, adm)
        if recording or metrics.enabled():  # remaining() costs a few µs; skip it when nobody reads it
            safely(span.budget, p.ctx.ledger.remaining())

        if p.decision.outcome == "require_approval":
            p.state = "approving"
            if shadow is not None:  # its decision is not kept waiting for the human's
                shadow.asking(p)
            refusal = self.approvals.run(p)
            if refusal is not None:
                return self.recorder.refused(p, refusal)
            # The answer can come minutes after the check above: a halt set meanwhile still stops the call.
            halt = self._halted(name, ctx)
            if halt is not None:
                return self.recorder.refused(p, halt_refusal(name, halt, p.call_id), extra={"halt_id": halt.id})
        p.state = "authorized"
        if p.journal is not None:
            problem = p.journal.write_intent(p)
            if problem is not None:
                # (`refused_at: "journal"`: the store holds no entry of the call, and the trail says why)
                unrecorded = AuditError(f"{name}: refused, the run store could not record the call before it ran: "
                                        f"{problem}")
                return self.recorder.refused(p, unrecorded, extra={"refused_at": "journal"})
        if self.audit is not None:
            intent = self.recorder.intent(p)
            if intent is not None and not intent.ok:
                return self.recorder.refused(p, AuditError(f"{name}: refused, the audit trail could not record the "
                                                           f"call before it ran: {intent.error}"), audited=False)
        p.state = "intent"
        return self._execute(p)

    def _open_span(self, name: str, call_id: str, ctx: RunContext, parent: Context | None) -> tool_span:
        try:
            return tool_span(self.tracer, tool=name, call_id=call_id, run=ctx.info, parent=parent)
        except Exception as exc:  # noqa: BLE001 - a broken tracer costs the call its span, nothing more
            return self._span_failed(name, call_id, ctx, exc)

    @staticmethod
    def _span_failed(name: str, call_id: str, ctx: RunContext, exc: Exception) -> tool_span:
        log.error("span_start_failed", tool=name, error=repr(exc))
        return tool_span(NoOpTracer(), tool=name, call_id=call_id, run=ctx.info)

    @staticmethod
    def _placed(p: InFlight, refusal: ToolDenied | None) -> ToolDenied:
        """Admission's refusal of call `p`, carrying the call's id."""
        assert refusal is not None
        refusal.call_id = p.call_id
        return refusal

    def _execute(self, p: InFlight) -> CallOutcome:
        name = p.name
        began = time.perf_counter_ns()
        p.state = "running"
        tool = p.tool
        try:
            timeout_s = p.facts.timeout_s
            if tool.in_call:  # it makes governed calls of its own (a managed agent): it gets this call
                p.value = tool.run_in_call(p.args, CallScope(self, p.ctx, p.call_id, p.span.context, timeout_s))
            else:
                p.value = tool.run(p.args, timeout_s)
        except ToolOutcomeUnknown as exc:  # it started; whether it took effect is not known (a call cut off)
            p.status = "unknown" if side_effect_rank(p.side_effect) > side_effect_rank("read") else "timeout"
            # (a ToolFailed: a program catching those catches it; one that must not repeat the call catches it by name)
            p.error = ToolOutcomeUnknown(f"{name}: {exc}", tool=name, call_id=p.call_id,
                                         error_type="ToolOutcomeUnknown")
        except TimeoutError as exc:
            p.status = "timeout"
            text = f"timed out after {p.facts.timeout_s:g}s" if p.facts.timeout_s is not None else "timed out"
            p.error = ToolFailed(f"{name}: {exc or text}", tool=name, call_id=p.call_id, error_type="TimeoutError")
        except Exception as exc:  # noqa: BLE001 - a tool's exception is its result, not the gate's crash
            p.status = "failed"
            p.error = ToolFailed(f"{name}: {type(exc).__name__}: {exc}", tool=name, call_id=p.call_id,
                                 error_type=type(exc).__name__)
        p.duration_ns = time.perf_counter_ns() - began
        p.state = "ran"
        return self._after_run(p)

    def _after_run(self, p: InFlight) -> CallOutcome:
        """Index and hand on the result of a call whose tool returned, then end it (the recorder). Each part
        is guarded on its own: nothing that fails here changes how the call ended (the tool has run)."""
        error = p.error = self.recorder.clean(p, p.error) if p.error is not None else None
        if p.ctx.provenance is not None:  # before the caller sees the result: its next call is decided on it
            self._index_result(p, p.value, error)
        if p.on_result is not None:
            try:
                p.on_result(p.value, error)
            except Exception as exc:  # noqa: BLE001 - the call has run; recording it comes first
                log.error("on_result_failed", tool=p.name, error=repr(exc), **log_fields(p.span))
        return self.recorder.finished(p)

    def _end_by_state(self, p: InFlight, exc: Exception) -> CallOutcome:
        """End a call after an unexpected fault, as its state allows: refused only if the tool never started."""
        if p.state == "done":  # only remembering it failed
            return CallOutcome(self.recorder.record_of(p, p.status, p.error), p.value, p.error)
        if p.state == "ran":
            return self._after_run(p)
        if p.state == "running":
            error = ToolFailed(f"{p.name}: the gate failed while the tool ran; it may have run: {exc!r}",
                               tool=p.name, call_id=p.call_id, error_type=type(exc).__name__)
            return self.recorder.interrupted(p, "unknown", error)
        return self.recorder.refused(p, ToolDenied(f"{p.name}: refused, the gate failed: {exc!r}", tool=p.name,
                                                   call_id=p.call_id))

    def _end_interrupted(self, p: InFlight, exc: BaseException) -> None:
        """Record how a call ended when the host was interrupted during it (the interrupt then goes on)."""
        why = interruption(exc)
        try:
            if p.state == "ran":
                self._after_run(p)
            elif p.state == "running":
                self.recorder.interrupted(p, "unknown", ToolFailed(
                            f"{p.name}: interrupted ({why}) while the tool ran; it may have run", tool=p.name,
                            call_id=p.call_id, error_type=type(exc).__name__))
            elif p.state != "done":
                if p.state == "approving":
                    self.recorder.about(p, "approval_resolved", {"run_id": p.ctx.info.id, "call_id": p.call_id,
                                                                 "tool": p.name, "verdict": "cancelled",
                                                                 "approver": None,
                                                                 "reason": f"interrupted ({why})", "wait_ns": 0,
                                                                 "grant": None, "refused": None})
                    safely(p.span.event, sc.APPROVAL_RESOLVED_EVENT, {sc.PROCTOR_APPROVAL_OUTCOME: "cancelled"})
                self.recorder.interrupted(p, "cancelled", CallRefused(
                            f"{p.name}: cancelled ({why}) before the tool ran", tool=p.name, call_id=p.call_id))
        except Exception as inner:  # noqa: BLE001 - the interrupt matters more than its record
            log.error("gate_interrupt_record_failed", tool=p.name, error=repr(inner))
