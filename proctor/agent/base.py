"""The step loop shared by `CodeAgent` and `ToolCallingAgent`.

One run: open it at the gate (fresh budgets and history), then for each step check
the model budgets, optionally plan, ask the model, act (the subclass runs a program
or the function calls, every tool call through the gate), record the step in the
audit trail and in the result, and stop at a final answer that passes the checks,
at `max_steps`, or when a run-wide budget is exhausted.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol, TypeVar, overload

from opentelemetry.context import Context
from opentelemetry.trace import Tracer

from proctor.agent.attachments import RunImages, with_images
from proctor.agent.durable import DurableRun, restore_context, step_from_dict
from proctor.agent.managed import MAX_AGENT_DEPTH, ScopedGate, agent_tool, managed_task, strictest_sandbox
from proctor.agent.models import LiteLLMModel, Message, Model, ModelError, ModelResponse, Usage
from proctor.agent.prompts import planning_prompt
from proctor.agent.result import RunResult, RunStatus, StepRecord
from proctor.agent.tracing import HeldChat, model_span
from proctor.approval.base import Approver, StoredApprover
from proctor.audit.base import AuditReader, AuditSink, AuditStartReader
from proctor.backends import AUDIT_KEY_ENV, load_audit
from proctor.calls import CallRecord, JSONValue, RunInfo
from proctor.errors import (
    AuditError,
    BudgetExceeded,
    ConfigurationError,
    ManagedAgentError,
    ProctorError,
    RunCancelled,
    RunTakenOver,
    StoreError,
    StoreForged,
)
from proctor.gate import CallScope, Gate, RunContext, agent_fields
from proctor.gate.gate import PolicyLike
from proctor.halt import SharesHalts
from proctor.interrupts import interruption, terminate_as_exception
from proctor.ledger.base import SharedLedger
from proctor.narrowing import Layer, StackedLedger
from proctor.policy import Policy
from proctor.policy.reload import PolicySource
from proctor.store.base import JournalEntry, RunRecord, RunStore
from proctor.store.seal import PURPOSE as SEAL_PURPOSE
from proctor.store.seal import StoreSeal
from proctor.store.trail import behind_trail, trails
from proctor.telemetry import AgentSpan, agent_span, get_tracer, step_span
from proctor.telemetry.logging import get_logger
from proctor.tools import Tool

if TYPE_CHECKING:
    from proctor.agent.streaming import StreamEvent
    from proctor.audit.keys import KeySource
    from proctor.policy.schema import BudgetSpec

__all__ = ["AUDIT_KEY_ENV", "AgentBase", "FinalAnswerCheck", "StepCallback", "load_audit", "load_policy",
           "policy_source"]

log = get_logger("proctor.agent")


class FinalAnswerCheck(Protocol):
    """A check on the final answer: ``check(answer, memory) -> bool``; False (or a raise) rejects it."""

    def __call__(self, answer: JSONValue, memory: Sequence[Message], /) -> bool: ...


StepCallback = Callable[[StepRecord], None]
_AgentT = TypeVar("_AgentT", bound="AgentBase")


def load_policy(policy: Policy | str | os.PathLike[str]) -> Policy:
    """A Policy as is, or a path loaded with `Policy.from_yaml` (PolicyError names the file, line and column)."""
    if isinstance(policy, (str, os.PathLike)):
        return Policy.from_yaml(policy)
    if not hasattr(policy, "decide"):
        raise ConfigurationError(f"policy must be a Policy or a path to a policy file, got {type(policy).__name__}")
    return policy


def policy_source(policy: Policy | PolicySource | str | os.PathLike[str]) -> Policy | PolicySource:
    """What an agent's gate decides with: a path becomes a `PolicySource`, reloaded when the file changes as a
    `Gate` given a path reloads it (a bad file at the start raises its located `PolicyError` here; a bad
    replacement later is refused and the old policy keeps deciding); a Policy or a source is taken as is."""
    if isinstance(policy, PolicySource):
        return policy
    if isinstance(policy, (str, os.PathLike)):
        return PolicySource(policy)
    return load_policy(policy)


def _no_policy() -> Policy:
    """The gate policy of an agent without one: it refuses everything (such an agent runs only managed)."""
    return Policy.from_dict({"version": 1, "default": "deny"})


class _Stop(Exception):
    """Ends the loop early with a status."""

    def __init__(self, status: RunStatus, message: str, pending: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.pending = list(pending)


class AgentBase:
    """The loop; subclasses implement `_system_prompt`, `_ask` and `_act`."""

    #: The agent's name in spans (`invoke_agent {name}`) when none is given.
    default_name = "agent"

    #: Set on the copy a managed invocation runs (`run_managed`): every policy whose run-wide budgets
    #: stop the loop (the run's and each managed agent's own), and the gate its interpreter talks to.
    _budget_policies: Sequence[PolicyLike] = ()
    #: How this agent's programs are isolated (a `CodeAgent`'s `sandbox=`); None for an agent that runs none.
    sandbox: str | None = None
    _scoped_gate: ScopedGate | None = None

    def __init__(
        self,
        tools: Iterable[Tool | Callable[..., Any]],
        model: Model,
        policy: Policy | PolicySource | str | os.PathLike[str] | None = None,
        *,
        approver: Approver | None = None,
        audit: AuditSink | str | os.PathLike[str] | None = None,
        max_steps: int = 20,
        planning_interval: int | None = None,
        final_answer_checks: Sequence[FinalAnswerCheck] = (),
        tracer: Tracer | None = None,
        name: str | None = None,
        instructions: str | None = None,
        step_callbacks: Sequence[StepCallback] = (),
        program_callbacks: Sequence[StepCallback] = (),
        store: RunStore | str | os.PathLike[str] | None = None,
        audit_key: KeySource | None = None,
        ledger: SharedLedger | str | None = None,
        description: str | None = None,
        managed_agents: Sequence[AgentBase] = (),
        shadow: Policy | str | os.PathLike[str] | None = None,
    ) -> None:
        if max_steps < 1:
            raise ConfigurationError("max_steps must be at least 1")
        if planning_interval is not None and planning_interval < 1:
            raise ConfigurationError("planning_interval must be at least 1 (or None)")
        self.model = model
        self.name = name or self.default_name
        #: What the agent does, as a parent's model sees it when this agent is one of its `managed_agents`.
        self.description = description
        # Without a policy of its own, an agent only runs as a managed agent, under its parent's policy.
        given = policy_source(policy) if policy is not None else None
        #: The source reloading the agent's policy file when it was given a path or a `PolicySource` (None for a
        #: Policy object): the gate decides with it, so a changed file takes effect at the next call, a bad one is
        #: refused while the old keeps deciding, each change is audited (`policy_changed`). Install SIGHUP on
        #: it (`agent.policy_source.install_sighup()`) for `kill -HUP` to check the file at once.
        self.policy_source: PolicySource | None = given if isinstance(given, PolicySource) else None
        self._policy: PolicyLike | None = given if not isinstance(given, PolicySource) else None
        self.audit, self.audit_path, self._owns_audit = load_audit(audit, audit_key)
        self.tracer = get_tracer(tracer)
        tools = list(tools)
        #: The agents this one hands tasks to, by name; each is a tool of this agent (`proctor.agent.managed`).
        self.managed_agents: dict[str, AgentBase] = self._check_managed(tools, managed_agents)
        tools += [agent_tool(agent) for agent in self.managed_agents.values()]
        # Any: the gate's PolicyLike protocol is structural and Policy satisfies it at run time.
        try:
            self.gate = Gate(given if given is not None else _no_policy(), approver=approver,
                             audit=self.audit, tracer=self.tracer, tools=tools, ledger=ledger,
                             shadow=load_policy(shadow) if shadow is not None else None)
        except BaseException:  # refused (a cross-run budget on a local ledger…): the log it opened is closed
            if self._owns_audit and self.audit is not None:
                self.audit.close()
            raise
        self.tools: list[Tool] = list(self.gate.tools.values())
        self.max_steps = max_steps
        self.planning_interval = planning_interval
        self.final_answer_checks = list(final_answer_checks)
        self.instructions = instructions
        self.step_callbacks = list(step_callbacks)
        self.program_callbacks = list(program_callbacks)
        self.memory: list[Message] = []
        # A run store makes runs durable (suspend, resume); an InboxApprover brings its own.
        self._owns_store = isinstance(store, (str, os.PathLike))
        self.store: RunStore | None = RunStore.open(store) if isinstance(store, (str, os.PathLike)) else store
        if self.store is None:
            self.store = approver.store if isinstance(approver, StoredApprover) else None
        if isinstance(self.store, SharesHalts):  # `proctor halt --store URL` stops this agent's calls too
            self.gate.honour_halts_of(self.store)
        if self.store is not None and self.audit is None:
            raise ConfigurationError("a durable run (a run store, or an InboxApprover) needs an audit trail "
                                     "(audit=PATH|URL): the trail's key seals what the run writes to the store, so "
                                     "that a resume can tell a forged entry (docs/durable.md, \"Who can do what\")")
        self._held_chats: list[HeldChat] = []
        #: Called with (step, record) for each call as the gate settles it: `run(task, stream=True)` and
        #: `proctor run`'s progress listen here.
        self.call_listeners: list[Callable[[int, CallRecord], None]] = []
        #: The result of the last run that ended (`replay` prints it); None before the first.
        self.last_run: RunResult | None = None
        #: The images of the run in progress (the task's, and those tools returned): see `proctor.agent.attachments`.
        self.images = RunImages()

    @property
    def policy(self) -> PolicyLike | None:
        """The agent's own policy (None: it runs only as a managed agent): a policy file's current one."""
        if self.policy_source is not None:
            return self.policy_source.current()
        return self._policy

    @policy.setter
    def policy(self, policy: PolicyLike | None) -> None:
        self.policy_source, self._policy = None, policy

    @property
    def provenance_policies(self) -> tuple[PolicyLike, ...]:
        """The policies of this agent and of every agent it manages, as they are now: the run keeps a
        provenance index when any of them reads it (a managed agent's own provenance() rule must not go
        blind), and a resumed run counts earlier results under all their labels as unseen."""
        return tuple(dict.fromkeys(
            p for p in (self.policy, *(q for a in self.managed_agents.values() for q in a.provenance_policies))
            if p is not None))

    def _check_managed(self, tools: Sequence[Any], agents: Sequence[AgentBase]) -> dict[str, AgentBase]:
        taken = {getattr(t, "name", getattr(t, "__name__", None)) for t in tools}
        out: dict[str, AgentBase] = {}
        for agent in agents:
            if not isinstance(agent, AgentBase):
                raise ConfigurationError(f"managed_agents takes CodeAgent or ToolCallingAgent objects, got "
                                         f"{type(agent).__name__}")
            if agent is self:
                raise ConfigurationError(f"agent {agent.name!r} cannot manage itself")
            if agent.name in out or agent.name in taken:
                raise ConfigurationError(f"managed agent name {agent.name!r} is already taken by another managed "
                                         "agent or a tool of this agent: give each a distinct name=")
            out[agent.name] = agent
        return out

    # -- subclass hooks -------------------------------------------------------------------------

    def _system_prompt(self) -> str:
        raise NotImplementedError

    def _ask(self, messages: Sequence[Message]) -> ModelResponse:
        raise NotImplementedError

    def _act(self, step: StepRecord, response: ModelResponse, ctx: RunContext, parent: Context) -> tuple[bool, Any]:
        """Carry out the model's answer; fill `step`; return (finished, answer)."""
        raise NotImplementedError

    def _reset_executor(self) -> None:
        """Forget every state kept between runs (the interpreter's worker, for `CodeAgent`)."""

    def _rebuild(self, ctx: RunContext, durable: DurableRun, steps: Sequence[StepRecord]) -> None:
        """On resume, before the step in progress: rebuild what earlier steps left (`CodeAgent`: the namespace)."""

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the interpreter and an audit log the agent opened itself."""
        if self._owns_audit and self.audit is not None:
            self.audit.close()
        if self._owns_store and self.store is not None:
            self.store.close()

    def __enter__(self: _AgentT) -> _AgentT:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop -------------------------------------------------------------------------------

    @overload
    def run(self, task: str, reset: bool = ..., principal: str | None = ..., labels: Mapping[str, str] | None = ...,
            *, stream: Literal[False] = ..., images: Sequence[Any] | None = ...) -> RunResult: ...
    @overload
    def run(self, task: str, reset: bool = ..., principal: str | None = ..., labels: Mapping[str, str] | None = ...,
            *, stream: Literal[True], images: Sequence[Any] | None = ...) -> Iterator[StreamEvent]: ...
    def run(
        self, task: str, reset: bool = True, principal: str | None = None, labels: Mapping[str, str] | None = None,
        *, stream: bool = False, images: Sequence[Any] | None = None,
    ) -> RunResult | Iterator[StreamEvent]:
        """Run `task` to a final answer, `max_steps`, a budget stop or an error; never raises for those.

        With ``stream=True``, an iterator instead: each step (`StepRecord`) as it ends and each call
        (`CallEvent`) as the gate settles it, then the `RunResult` (see `proctor.agent.streaming`).
        `images` (PIL images, paths or bytes) go to the model with the task, as content parts; one
        that cannot be used raises `ImageError` before the run starts (`proctor.images` has the limits).
        """
        run_images = RunImages()
        loaded = run_images.add_task_images(images) if images else []  # a bad image raises here, in the caller
        if stream:
            from proctor.agent.streaming import stream_run

            return stream_run(self, lambda: self.run(task, reset, principal, labels, images=loaded))
        if self.policy is None:
            raise ConfigurationError(f"agent {self.name!r} has no policy of its own, so it runs only as a managed "
                                     "agent (managed_agents=[…] of another agent): give it policy=… to run it")
        started = time.perf_counter_ns()
        if reset:
            self.memory = []
            self._reset_executor()
        steps: list[StepRecord] = []
        try:
            ctx = self.gate.start_run(principal=principal, labels=labels, task=task, agent=self.name,
                                      provenance=self._reads_provenance())
            ctx.sandbox_floor = self.sandbox  # managed agents' programs run no looser
            if not reset and self.memory and ctx.provenance is not None:
                # The transcript and the worker's variables carry earlier runs' results, which this run's
                # index never saw: count them as unseen content of every label (as a resumed run does).
                ctx.provenance.mark_incomplete(label for p in self.provenance_policies
                                               for label in p.result_labels)
        except ProctorError as exc:
            return RunResult(None, "error", steps, Usage(), None, run_id="", audit_path=self.audit_path,
                             error=str(exc), duration_ns=time.perf_counter_ns() - started,
                             sandbox=self.sandbox_line(), ledger=self.gate.ledger_scope.summary)
        self.images = run_images
        if not self.memory:
            self.memory.append({"role": "system", "content": self._system_prompt()})
        self.memory.append({"role": "user", "content": with_images(f"New task:\n{task}", loaded)})
        return self._drive(ctx, task, steps, started, None)

    def replay(self, file: IO[str] | None = None) -> None:
        """Print the last run step by step: thought, program, each call with its decision, approval and
        outcome, output and errors, then the summary; to `file` (default stdout), from memory alone."""
        if self.last_run is None:
            raise ConfigurationError("no run to replay: call agent.run(task) first")
        from proctor.agent.render import print_run  # rich is only loaded when a run is shown

        print_run(self.last_run, file=file)

    def resume(self, run_id: str) -> RunResult:
        """Go on with a suspended run (or one whose process died) from the store; see docs/durable.md.

        The step in progress re-runs its program in a fresh worker: calls made before the pause
        are answered from the journal (no tool runs twice), the pending call gets its answer, and
        the run continues. Raises `StoreError` when the run cannot be resumed (unknown, finished,
        or held by a live process).
        """
        started = time.perf_counter_ns()
        if self.store is None:
            raise StoreError("resume needs a run store: CodeAgent(..., store=RunStore.open(URL))")
        checked, journals = self._check_resumable(self.store, run_id)
        durable = DurableRun.claim(self.store, run_id, self._idempotent_tools(), self._store_seal(),
                                   checked=(checked, journals))
        record = durable.record
        info = RunInfo(id=record.run_id, step=max(0, record.step - 1), principal=record.principal,
                       labels=dict(record.labels), agent=self.name)
        try:
            ctx = self.gate.resume_run(info, task=record.task, provenance=self._reads_provenance(),
                                       previous_policy_sha256=record.policy_sha256, linked_trace_id=record.trace_id)
        except ProctorError:
            durable.end("suspended", answer=None, error=record.error, steps=(), pending=())
            raise
        ctx.agents = (self.name,)
        ctx.sandbox_floor = self.sandbox
        if ctx.provenance is not None:  # earlier results of tools the managed agents' policies label: unseen too
            ctx.provenance.mark_incomplete(label for p in self.provenance_policies
                                           for label in p.result_labels)
        restore_context(ctx, record)
        self.images = RunImages()  # images already in the saved messages are not counted again
        self.memory = [dict(m) for m in record.messages]
        self._reset_executor()
        steps = [step_from_dict(d) for d in record.steps]
        self._rebuild(ctx, durable, steps)
        return self._drive(ctx, record.task, steps, started, durable)

    def _check_resumable(self, store: RunStore, run_id: str) -> tuple[RunRecord, dict[int, list[JournalEntry]]]:
        """Everything a resume needs, checked before the run is claimed (so before anything runs): the run
        is resumable, the model can be used, every tool the run has called is here. A failure raises
        `StoreError` naming what is missing, and leaves the run as it was (suspended, answerable). Returns the
        record and journals it checked: the resume goes on from these, not from another read of the store."""
        record = store.get_run(run_id)
        if record.status not in ("suspended", "running"):
            raise StoreError(f"run {run_id} is {record.status}: there is nothing to resume")
        journals = self._check_sealed(store, record)  # first: nothing the store says is read before it is believed
        problems: list[str] = []
        if isinstance(self.model, LiteLLMModel):
            try:
                self.model.check()
            except ModelError as exc:
                problems.append(f"the model cannot be used: {exc}")
        called: set[str] = set()  # the run's own calls (a managed agent's are made with its own tools)
        for entries in journals.values():
            called.update(entry.tool for entry in entries)
        missing = sorted(called - set(self.gate.tools))
        if missing:
            problems.append(f"the run called tools this agent does not have: {', '.join(missing)} "
                            "(give resume the same tools as the run)")
        if problems:
            raise StoreError(f"cannot resume run {run_id}: {'; '.join(problems)}; nothing ran, the run is still "
                             f"{record.status}")
        return record, journals

    def _store_seal(self) -> StoreSeal | None:
        """What seals this agent's runs in the store: a key of its audit trail's (None without one)."""
        return StoreSeal(self.audit.key_for(SEAL_PURPOSE)) if self.audit is not None else None

    def _check_sealed(self, store: RunStore, record: RunRecord) -> dict[int, list[JournalEntry]]:
        """Refuse a run whose store entries this agent's audit trail did not seal, or that are behind what the
        trail recorded of the run (an earlier sealed version put back: `proctor.store.trail`); `resume_refused`,
        audited."""
        seal = self._store_seal()
        try:
            if seal is None:
                raise StoreForged(f"run {record.run_id}: cannot check what the store holds for it without the "
                                  "audit trail whose key sealed it (give the agent the run's audit=...)")
            # The record first: its step says how many journals to read, and a forged one must not make the
            # resume read the store a hundred billion times before its seal is found wrong.
            seal.check_record(record)
            journals = {step: store.journal(record.run_id, step) for step in range(1, record.step + 1)}
            seal.check_run(record, journals)
            # Sealed is not enough: an earlier sealed version put back is caught against the trail's order.
            if not isinstance(self.audit, AuditReader):
                raise StoreForged(f"run {record.run_id}: its audit trail ({type(self.audit).__name__}) cannot be "
                                  "read back to check the store against it (a durable run needs an AuditLog, a "
                                  "PostgreSQL audit log or another AuditReader)")
            try:
                # From the run's start where the reader can begin there (a file log: the hint is checked there).
                records = (self.audit.run_records_from(record.run_id, record.audit_start)
                           if record.audit_start is not None and isinstance(self.audit, AuditStartReader)
                           else self.audit.run_records(record.run_id))
                trail = trails(records, record.run_id).get(record.run_id)
            except AuditError as exc:
                raise StoreForged(f"run {record.run_id}: cannot read its audit trail to check the store against "
                                  f"it: {exc}") from None
            approvals = store.list_approvals(status=None, run_id=record.run_id)
            for problem in behind_trail(record, journals, trail, approvals):
                raise StoreForged(problem.line())
        except StoreForged as exc:
            self.gate.recorder.append("resume_refused", {"run_id": record.run_id, "reason": str(exc)})
            raise StoreForged(f"resume refused: {exc}; nothing ran (see docs/durable.md, \"Who can do what\")"
                              ) from None
        return journals

    def sandbox_line(self) -> str:
        """How this agent's programs are isolated, as its run summary says after ``sandbox:``."""
        return "not used (a tool-calling agent runs no model-written code)"

    def prompt_policy(self) -> PolicyLike:
        """The policy the system prompt describes the tools with: the agent's own, else the run's (its gate's)."""
        return self.policy if self.policy is not None else self.gate.policy

    def _reads_provenance(self) -> bool:
        """Whether a policy of this agent or of an agent it manages calls provenance()/from_user()."""
        return any(p.uses_provenance for p in self.provenance_policies)

    def _idempotent_tools(self) -> set[str]:
        declared = self.policy.model.tools if self.policy is not None else {}
        return {name for name, spec in declared.items() if spec.idempotent}

    def _drive(self, ctx: RunContext, task: str, steps: list[StepRecord], started: int,
               durable: DurableRun | None) -> RunResult:
        answer: Any = None
        error: str | None = None
        interrupt: BaseException | None = None
        taken_over = False
        pending: list[Any] = []
        resuming = durable is not None
        link = (durable.record.trace_id, durable.record.span_id) if durable is not None else None
        if self.call_listeners:
            ctx.on_call = lambda record: _tell(self.call_listeners, ctx.info.step, record)
        with terminate_as_exception(), \
                agent_span(self.tracer, agent_name=self.name, run=ctx.info, model=self.model.model_id,
                           links=[link] if link and link[0] and link[1] else ()) as span:
            trace_id = span.trace_id
            try:
                if durable is None and self.store is not None:
                    durable = DurableRun.start(self.store, ctx, task=task, agent=self.name,
                                               policy_sha256=self.gate.policy_for(ctx).sha256,
                                               trace=(trace_id, span.span_id), idempotent=self._idempotent_tools(),
                                               seal=self._store_seal())
                answer = self._loop(ctx, span, steps, durable, resuming)
                status: RunStatus = "done"
            except _Stop as stop:
                status, error, pending = stop.status, str(stop), stop.pending
            except RunCancelled as exc:
                status, error = "cancelled", str(exc)
            except RunTakenOver as exc:  # the run goes on in the process that took it: not an ending of the run
                status, error, taken_over = "interrupted", str(exc), True
            except Exception as exc:  # noqa: BLE001 - a run reports its failure; it does not crash the caller
                log.error("agent_run_failed", run_id=ctx.info.id, error=repr(exc))
                status, error = "error", f"{type(exc).__name__}: {exc}"
            except BaseException as exc:  # noqa: BLE001 - Ctrl-C, SIGTERM: recorded below, then raised again
                interrupt = exc
                status, error = "interrupted", f"interrupted by {interruption(exc)}"
            usage = sum((s.usage for s in steps), Usage())
            costs = [s.cost_usd for s in steps if s.cost_usd is not None]
            cost = sum(costs) if costs else None
            # The run span's usage is the sum of its steps': each step span adds its own to it.
            scrubbed = ctx.scrub(error) if error else None
            span.finish(status, None if status == "done" else status, scrubbed)
            if status == "suspended":
                self.gate.suspend_run(ctx, [a.id for a in pending], steps=len(steps))
            else:  # (`taken_over`: this process stopped working on it, another goes on: not an ending of the run)
                self.gate.finish_run(ctx, status=status, steps=len(steps), error=scrubbed,
                                     usage={**usage.as_dict(), "cost_usd": cost},
                                     taken_over=taken_over)
        ctx.journal = None
        if durable is not None:
            if interrupt is not None or taken_over:  # left as it was (or to the process that took it over)
                durable.release()
            else:
                durable.end(status, answer=answer, error=error, steps=steps, pending=pending)
        if interrupt is not None:
            raise interrupt
        self.last_run = RunResult(answer, status, steps, usage, cost, run_id=ctx.info.id,
                                  audit_path=self.audit_path, trace_id=trace_id, error=error,
                                  duration_ns=time.perf_counter_ns() - started, budget_usage=ctx.ledger.usage(),
                                  budget_remaining=ctx.ledger.remaining(), pending=pending,
                                  sandbox=self.sandbox_line(), ledger=self.gate.ledger_scope.summary)
        return self.last_run

    def run_managed(self, task: str, additional_args: Mapping[str, Any] | None, scope: CallScope) -> Any:
        """Work on `task` for a parent agent, inside its run: the gate runs this for the parent's call to
        this agent (`proctor.agent.managed.AgentTool`). Returns the final answer; raises
        `ManagedAgentError` (no answer), `TimeoutError` (the call's time is up) or `ConfigurationError`
        (a chain that would run this agent twice, or too deep), which the gate records as the call's
        ending. An interrupt goes through: the gate records the call as ended `unknown`."""
        parent = scope.context
        chain = parent.agents or ((parent.info.agent,) if parent.info.agent else ())
        if self.name in chain:
            raise ConfigurationError(f"agent {self.name!r} is already working in this call chain "
                                     f"({' -> '.join(chain)}): an agent cannot hand a task to itself")
        if len(chain) > MAX_AGENT_DEPTH:
            raise ConfigurationError(f"managed agents nest at most {MAX_AGENT_DEPTH} deep "
                                     f"({' -> '.join(chain)} -> {self.name})")
        gate = scope.gate
        deadline = time.monotonic() + scope.timeout_s if scope.timeout_s is not None else None
        own: Layer | None = None
        # (asked once: a reloading policy file gives one policy for the whole invocation, its rules and budgets)
        mine = self.policy
        if mine is not None:  # its own policy narrows the run's; its budgets count its calls only
            info = replace(parent.info, step=0, agent=self.name)
            own = Layer(self.name, mine, mine.new_ledger(info, gate.ledger), self.gate.approver)
        ledger = StackedLedger(parent.ledger, own.ledger if own is not None else None, agent=self.name,
                               timeout_s=scope.timeout_s)
        ctx = parent.delegate(self.name, ledger=ledger, tools=self.gate.tools, layer=own,
                              parent_call_id=scope.call_id, deadline=deadline)
        ledger.deadline = ctx.deadline  # the earlier of the parent's and this call's
        ctx.sandbox_floor = strictest_sandbox(parent.sandbox_floor, self.sandbox)
        runner: AgentBase = self._managed_copy(gate, ctx)
        runner.memory.append({"role": "user",
                              "content": "New task:\n" + managed_task(self.name, task, additional_args)})
        steps: list[StepRecord] = []
        started = time.perf_counter_ns()
        answer: Any = None
        error: str | None = None
        status: RunStatus = "error"
        try:
            with agent_span(gate.tracer, agent_name=self.name, run=ctx.info, model=self.model.model_id,
                            description=self.description, parent=scope.parent) as span:
                try:
                    answer = runner._loop(ctx, span, steps)
                    status = "done"
                except _Stop as stop:
                    status, error = stop.status, str(stop)
                except Exception as exc:  # noqa: BLE001 - reported to the parent as the call's error
                    log.error("managed_agent_failed", run_id=ctx.info.id, agent=self.name, error=repr(exc))
                    status, error = "error", f"{type(exc).__name__}: {exc}"
                span.finish(status, None if status == "done" else status, ctx.scrub(error) if error else None)
        finally:
            runner._reset_executor_for_good()
        usage = sum((s.usage for s in steps), Usage())
        costs = [s.cost_usd for s in steps if s.cost_usd is not None]
        self.last_run = RunResult(answer, status, steps, usage, sum(costs) if costs else None, run_id=ctx.info.id,
                                  audit_path=self.audit_path, error=error,
                                  duration_ns=time.perf_counter_ns() - started, budget_usage=ledger.usage(),
                                  budget_remaining=ledger.remaining())
        if status == "done":
            return answer
        said = ctx.scrub(error or status)
        if ctx.deadline is not None and time.monotonic() >= ctx.deadline:
            raise TimeoutError(f"managed agent {self.name!r} ran out of time after {len(steps)} step(s): {said}")
        raise ManagedAgentError(f"managed agent {self.name!r} ended without a final answer ({status}): {said}")

    def _managed_copy(self, gate: Gate, ctx: RunContext) -> AgentBase:
        """A copy of this agent for one managed invocation: its own memory and executor, the run's gate,
        audit trail and tracer, the policies whose run-wide budgets stop it. The agent itself is not
        changed, so it can be handed tasks by several parents, or twice at once."""
        runner: AgentBase = copy.copy(self)  # this class's own state, set on a copy of itself
        runner.gate = gate
        runner.audit, runner.tracer = gate.audit, gate.tracer
        runner._owns_audit = runner._owns_store = False
        runner.store = None
        runner.memory, runner._held_chats, runner.call_listeners = [], [], []
        runner.images = RunImages()
        # (the policy deciding the run's calls: under `reload: new_runs`, the run's own, not the file's current one)
        runner._budget_policies = (gate.policy_for(ctx), *(layer.policy for layer in ctx.layers))
        runner._scoped_gate = ScopedGate(gate)
        if ctx.sandbox_floor is not None and runner.sandbox is not None:
            runner.sandbox = ctx.sandbox_floor  # never looser than an agent above it (strictest_sandbox)
        runner._fresh_executor()
        if runner.policy is None:  # prompts describe the tools with the run's policy
            runner.policy = gate.policy
        runner.memory = [{"role": "system", "content": runner._system_prompt()}]
        return runner

    def _fresh_executor(self) -> None:
        """On a managed copy: forget the original's executor (the copy starts its own on first use)."""

    def _reset_executor_for_good(self) -> None:
        """On a managed copy, when its invocation ends: stop its executor."""

    def _loop(self, ctx: RunContext, parent: AgentSpan, steps: list[StepRecord], durable: DurableRun | None = None,
              resuming: bool = False) -> Any:
        first = ctx.info.step + 1
        for number in range(first, self.max_steps + 1):
            again = resuming and number == first  # the step in progress when the run stopped
            saved = durable.saved_response() if again and durable is not None else None
            if not again:
                self._check_model_budget(ctx)
                if self.planning_interval and (number - 1) % self.planning_interval == 0:
                    self._plan(number, ctx, parent, steps)
                    self._check_model_budget(ctx)
            ctx.next_step()
            if durable is not None:
                durable.step_started(ctx, number, self.memory, steps, resuming=again)
            step = StepRecord(number, images=self.images.pop_task())  # the task's images: in the first step
            began = time.perf_counter_ns()
            first_call = len(ctx.records)
            with step_span(self.tracer, step=number, parent=parent, run=ctx.info) as sspan:
                sctx = sspan.context
                try:
                    if saved is not None:  # resumed: the model already answered; act on that answer again
                        response = saved
                        step.model_output, step.usage, step.cost_usd = saved.content, saved.usage, saved.cost_usd
                        # the run's own budgets; shared pools counted it the first time
                        ctx.ledger.charge_model(saved.usage.total_tokens, saved.cost_usd or 0.0, shared=False)
                    else:
                        response = self._generate(self.memory, ctx, step, sctx)
                        if durable is not None:
                            durable.responded(response)
                    finished, answer = self._act(step, response, ctx, sctx)
                    if step.code is not None:
                        sspan.code(ctx.scrub(step.code))
                    if finished:
                        rejection = self._check_final_answer(answer)
                        if rejection is not None:
                            finished, step.final_answer = False, False
                            step.observation = (step.observation + "\n" + rejection).strip()
                            self.memory.append({"role": "user", "content": rejection})
                except BaseException as exc:
                    # Whatever ended the step (an interrupt, a bug) the calls it made are its calls.
                    if not step.tool_calls:
                        step.tool_calls = list(ctx.records[first_call:])
                    step.error = step.error or (f"interrupted by {interruption(exc)}" if not isinstance(exc, Exception)
                                                else f"{type(exc).__name__}: {exc}")
                    raise
                finally:
                    self._close_chats(ctx)
                    if ctx.journal is not None:
                        ctx.journal.flush()
                    step.duration_ns = time.perf_counter_ns() - began
                    sspan.usage(step.usage.input_tokens, step.usage.output_tokens)
                    sspan.span.set_attribute("proctor.step.calls", len(step.tool_calls))
                    if step.images:  # what came in, by digest and size: never the image
                        sspan.span.set_attribute("proctor.step.images", json.dumps(step.images, sort_keys=True))
                    steps.append(step)
                    self._record_step(ctx, step)
            if durable is not None:
                pending = durable.pending_for(step.tool_calls)
                if pending:
                    raise _Stop("suspended", f"waiting for approval of {', '.join(a.tool for a in pending)} "
                                             f"({', '.join(a.id for a in pending)})", pending)
            if finished:
                return answer
            stop = self._budget_stop(step.tool_calls, ctx)
            if stop is not None:
                raise _Stop("budget_exhausted", stop)
        raise _Stop("max_steps", f"no final answer after {self.max_steps} steps")

    def _generate(self, messages: Sequence[Message], ctx: RunContext, step: StepRecord, parent: Context
                  ) -> ModelResponse:
        with model_span(self.tracer, parent, model=self.model.model_id) as chat:
            try:
                response = self._ask(messages)
            except ModelError as exc:
                step.error = str(exc)
                raise _Stop("error", str(exc)) from None
            chat.answered(messages, response)
        self._held_chats.append(chat)  # closed when the step ends: see `_close_chats`
        step.model_output = response.content
        step.usage = response.usage
        step.cost_usd = response.cost_usd
        ctx.ledger.charge_model(response.usage.total_tokens, response.cost_usd or 0.0)
        return response

    def _close_chats(self, ctx: RunContext) -> None:
        """End the step's chat spans, their captured content scrubbed of what the step revealed."""
        held, self._held_chats = self._held_chats, []
        for chat in held:
            try:
                chat.close(ctx.scrub)
            except Exception as exc:  # noqa: BLE001 - telemetry never ends a run
                log.error("chat_span_failed", error=repr(exc))

    def _plan(self, number: int, ctx: RunContext, parent: AgentSpan, steps: list[StepRecord]) -> None:
        step = StepRecord(number, kind="planning", images=self.images.pop_task())
        began = time.perf_counter_ns()
        with step_span(self.tracer, step=number, parent=parent, run=ctx.info) as sspan:
            sspan.span.set_attribute("proctor.step.kind", "planning")
            try:
                ask = {"role": "user", "content": planning_prompt(number)}
                response = self._generate([*self.memory, ask], ctx, step, sspan.context)
                sspan.usage(step.usage.input_tokens, step.usage.output_tokens)
            finally:
                self._close_chats(ctx)
                step.duration_ns = time.perf_counter_ns() - began
                steps.append(step)
                self._record_step(ctx, step)
        self.memory.append({"role": "assistant", "content": f"Plan:\n{response.content}"})
        self.memory.append({"role": "user", "content": "Now proceed with your plan."})

    def _check_model_budget(self, ctx: RunContext) -> None:
        """Between steps: stop at a model budget, or at a run-wide wall-time budget that has run out
        (or, for a managed agent, when its time is up)."""
        if ctx.deadline is not None and time.monotonic() >= ctx.deadline:
            raise _Stop("error", f"the time given to managed agent {self.name!r} is up")
        try:
            ctx.ledger.check_model()
        except BudgetExceeded as exc:
            raise _Stop("budget_exhausted", str(exc)) from None
        # A model that only thinks makes no calls, so the gate would never see the clock run out.
        remaining = ctx.ledger.remaining()
        for budget in self._run_wide_budgets(ctx):
            left = remaining.get(budget.name, {}).get("wall_time_ms")
            if left is not None and left <= 0:
                raise _Stop("budget_exhausted", f"budget '{budget.name}' exhausted: wall time "
                                                f"{budget.limit.wall_time:g}s used")

    def _run_wide_budgets(self, ctx: RunContext) -> list[BudgetSpec]:
        # The policy deciding the run's calls now (a reloaded one; under `reload: new_runs`, the run's first).
        policies = self._budget_policies or ((self.gate.policy_for(ctx),) if self.policy is not None else ())
        return [b for policy in policies for b in policy.model.budgets if b.match is None and b.per == "run"]

    def _budget_stop(self, calls: Sequence[CallRecord], ctx: RunContext) -> str | None:
        """The reason to stop when a call was refused by a budget that covers the whole run."""
        run_wide = {b.name for b in self._run_wide_budgets(ctx)}
        for call in calls:
            if call.budget is not None and call.budget in run_wide:
                return call.error or f"budget '{call.budget}' exhausted"
        return None

    def _check_final_answer(self, answer: Any) -> str | None:
        for check in self.final_answer_checks:
            label = getattr(check, "__name__", type(check).__name__)
            try:
                ok = bool(check(answer, self.memory))
            except Exception as exc:  # noqa: BLE001 - a check that raises rejects, with its message
                return f"Your final answer was rejected by check {label}: {type(exc).__name__}: {exc}. Continue."
            if not ok:
                return f"Your final answer was rejected by check {label}. Fix it and continue."
        return None

    def _announce(self, step: StepRecord) -> None:
        """Tell `program_callbacks` what is about to run (before any call of the step)."""
        _notify(self.program_callbacks, step)

    def _record_step(self, ctx: RunContext, step: StepRecord) -> None:
        _notify(self.step_callbacks, step)
        if self.audit is None:
            return
        fields = {
            "run_id": ctx.info.id, "step": step.number, "step_kind": step.kind, "model": self.model.model_id,
            "usage": step.usage.as_dict(), "cost_usd": step.cost_usd,
            # The thought and the program may quote a redacted value: scrubbed, never in clear.
            "thought": ctx.scrub(step.thought) if step.thought else None,
            "code": ctx.scrub(step.code) if step.code else step.code,
            "call_ids": [c.call_id for c in step.tool_calls], "error": ctx.scrub(step.error) if step.error else None,
            "final_answer": step.final_answer, "duration_ns": step.duration_ns,
        }
        if step.images:  # digest, bytes, size and format of each image the step brought in: never the bytes
            fields["images"] = step.images
        if ctx.parent_call_id is not None:  # a managed agent's step: same run, its own name
            fields.update(agent_fields(ctx))
        try:
            result = self.audit.append("step", fields, durable=False)
        except Exception as exc:  # noqa: BLE001 - sinks should not raise; a lost step record is logged
            log.error("audit_step_failed", error=repr(exc))
            return
        if not result.ok:
            log.error("audit_step_failed", error=result.error)


def _tell(listeners: Sequence[Callable[[int, CallRecord], None]], step: int, record: CallRecord) -> None:
    for listener in listeners:
        try:
            listener(step, record)
        except Exception as exc:  # noqa: BLE001 - a listener must not fail the call it hears about
            log.warning("call_listener_failed", error=repr(exc))


def _notify(callbacks: Sequence[StepCallback], step: StepRecord) -> None:
    for callback in callbacks:
        try:
            callback(step)
        except Exception as exc:  # noqa: BLE001 - a display callback must not end the run
            log.warning("step_callback_failed", error=repr(exc))
