"""`Interpreter`: run one model program per step in a sandboxed worker; every tool call goes to the gate.

The worker holds stubs only. Each stub call arrives here as a request, is handed to
`gate.submit` (which never raises), and its value or error goes back to the stub,
which returns it or raises the same-named exception at the call site. The step's
clock stops while the host serves a request, so a slow tool or a human approving a
call does not eat the program's time; at the deadline the worker is killed.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import time
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from proctor.calls import CallPosition, CallRecord, JSONValue, line_widths, new_id
from proctor.canonical import canonical_sha256
from proctor.errors import (
    ApprovalDenied,
    ConfigurationError,
    ExecutionTimeout,
    ProctorError,
    SandboxError,
    StepInterrupted,
    ToolDenied,
    ToolFailed,
)
from proctor.interpreter import spinning
from proctor.interpreter.channel import (
    SCALAR_TYPES,
    SPIN_NS,
    EncodeError,
    ProtocolError,
    encode_value,
    frame,
    reply_frame,
    unsendable_return,
)
from proctor.interpreter.host import WorkerDied, WorkerProcess
from proctor.interpreter.limits import ChannelLimits, OversizedCall, call_args_bytes, size_text
from proctor.interpreter.messages import (
    CallRequest,
    Done,
    Final,
    Ready,
    error_payload,
    parse_worker_message,
    refused_record,
)
from proctor.interpreter.result import ExecutionResult, ProgramError
from proctor.interpreter.sandbox import (
    INSTALL_HINT,
    SandboxSpec,
    bwrap_status,
    describe_isolation,
    require_bwrap,
    site_paths,
    worker_env,
)
from proctor.interpreter.specs import STDLIB, limits_for, tool_spec
from proctor.policy.admission import FactSource, facts_of
from proctor.telemetry.logging import get_logger
from proctor.tools import Tool, as_tool

__all__ = ["ExecutionResult", "GateLike", "Interpreter", "ProgramError", "SandboxMode"]

log = get_logger("proctor.interpreter")
SandboxMode = Literal["auto", "bwrap", "process", "none"]
FINAL_GRACE = 1.0  # seconds a program may run on after final_answer() before it is stopped
_UNANSWERED: Any = object()  # `Interpreter._answered` while the gate has not called `on_result`
#: The worker's spin window in seconds: a call that took longer is answered with "spin": false (`_on_result`).
_SPIN_S = SPIN_NS / 1e9
MiB = 1024 * 1024

if TYPE_CHECKING:  # types only: the gate is built on this module, and hands the interpreter its run contexts
    from opentelemetry.context import Context

    from proctor.audit.base import AuditResult, AuditSink
    from proctor.gate.call import CallOutcome
    from proctor.gate.run import RunContext
    from proctor.policy.schema import PolicyModel


class _PolicyLike(FactSource, Protocol):
    """The tools' facts (their argument limits, read through admission) and the file's settings."""

    @property
    def model(self) -> PolicyModel: ...


class GateLike(Protocol):
    """What the interpreter needs of a gate; `proctor.Gate` is one."""

    @property
    def audit(self) -> AuditSink | None: ...
    @property
    def policy(self) -> _PolicyLike: ...  # its `sandbox:` (required: no worker without bubblewrap)
    def policy_for(self, ctx: RunContext) -> _PolicyLike: ...  # the run's (a reloaded file's): its `sandbox:` too

    def register(self, *tools: Tool) -> None: ...
    def start_run(self) -> RunContext: ...
    def finish_run(self, ctx: RunContext, status: str = "done") -> None: ...
    def submit(self, tool: str, args: Mapping[str, JSONValue] | None = None, *, context: RunContext | None = None,
               call_id: str | None = None, parent: Context | None = None,
               on_result: Callable[[object, ProctorError | None], None] | None = None,
               position: CallPosition | None = None) -> CallOutcome: ...
    #: Record and refuse a call whose arguments the interpreter would not decode (over a size limit).
    def refuse(self, tool: str, reason: str, *, context: RunContext | None = None, call_id: str | None = None,
               parent: Context | None = None,
               args_sha256: str | None = None, args_bytes: int | None = None) -> CallOutcome: ...


class Interpreter:
    """A persistent, sandboxed Python namespace whose tool calls all pass one gate (see the module docstring)."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]], gate: GateLike, *, timeout: float = 30,
                 authorized_imports: Iterable[str] = (), sandbox: SandboxMode = "auto",
                 memory_limit: int | None = 512 * MiB, max_output: int = 50_000, context: RunContext | None = None,
                 cpu_limit: int = 3600, max_processes: int = 64, start_timeout: float = 30.0,
                 final_answer: Tool | Callable[..., Any] | None = None, hash_seed: int | None = None,
                 max_arg_bytes: int = 1 * MiB, max_run_arg_bytes: int = 64 * MiB, max_frame_bytes: int = 4 * MiB,
                 max_depth: int = 100, max_containers: int = 100_000, max_values: int = 250_000) -> None:
        if sandbox not in ("auto", "bwrap", "process", "none"):
            raise ConfigurationError(f"sandbox must be 'auto', 'bwrap', 'process' or 'none', not {sandbox!r}")
        if timeout <= 0 or max_output <= 0:
            raise ConfigurationError("timeout and max_output must be positive")
        self.tools = [as_tool(t) for t in tools]
        # A tool named final_answer computes the answer from final_answer()'s arguments, through the gate.
        self.final_tool = as_tool(final_answer) if final_answer is not None else None
        if self.final_tool is not None and self.final_tool.name != "final_answer":
            raise ConfigurationError(f"final_answer= takes a tool named 'final_answer', not {self.final_tool.name!r}")
        self.gate = gate
        gate.register(*self.tools, *([self.final_tool] if self.final_tool else []))
        self.timeout, self.max_output, self.start_timeout = float(timeout), int(max_output), start_timeout
        self.authorized_imports = tuple(authorized_imports)
        check_installed(self.authorized_imports)
        self.context = context
        #: Whether `context` is the run this interpreter started itself (no `context=`): `close` finishes it.
        self._own_run = False
        self.sandbox = sandbox
        if gate.policy.model.sandbox == "required":
            require_bwrap(sandbox)  # before anything starts: the policy's floor, whatever the caller asked
        self.isolation = self._choose_isolation(sandbox)
        #: How this interpreter's workers are held, as run summaries print it: "bubblewrap" or
        #: "process only (bubblewrap not installed: apt-get install bubblewrap)" and the like.
        self.sandbox_line = describe_isolation(self.isolation, sandbox)
        self._names = {t.name for t in self.tools} | ({"final_answer"} if self.final_tool else set())
        self.channel_limits = self._channel_limits(max_arg_bytes, max_run_arg_bytes, max_frame_bytes, max_depth,
                                                   max_containers, max_values)
        # "*" allows every installed package, so it needs them bound like a named third-party one.
        needs_site = any(n == "*" or n.partition(".")[0] not in STDLIB for n in self.authorized_imports)
        # Tools whose return annotation says their result cannot reach the program: refused before they run.
        self._unsendable = {t.name: reason for t in self.tools
                            if (reason := unsendable_return(_return_type(t), needs_site)) is not None}
        # A fixed PYTHONHASHSEED (durable runs) makes set and str-hash order the same in every worker.
        env = {**worker_env(), "PYTHONHASHSEED": str(hash_seed)} if hash_seed is not None else {}
        self._spec = SandboxSpec(self.isolation, extra_paths=tuple(site_paths()) if needs_site else (), env=env)
        self._limits = limits_for(self.isolation, memory_limit, cpu_limit, max_processes, self._spec.tmpfs_bytes)
        self._init: dict[str, Any] = {
            "t": "init", "tools": [tool_spec(t) for t in self.tools], "imports": list(self.authorized_imports),
            "max_output": self.max_output, "isolation": self.isolation,
            "sys_path": site_paths() if needs_site else [],
            "limits": self._limits,
            "channel": {"max_frame_bytes": self.channel_limits.max_frame_bytes,
                        "max_depth": self.channel_limits.max_depth,
                        "max_containers": self.channel_limits.max_containers,
                        "max_values": self.channel_limits.max_values},
        }
        if self.final_tool is not None:
            self._init["final_tool"] = tool_spec(self.final_tool, final=True)
        self._lock = threading.RLock()
        self._code = ""
        self._lines: list[int] | None = None  # the program's line widths, at its first call with a position
        self._closed = False
        self._seq = 0
        self._lost = False
        self._key = ""
        self._arg_run: Any = None  # the run whose argument bytes `_arg_bytes` counts
        self._arg_bytes = 0
        self._run_arg_limit = self.channel_limits.max_run_arg_bytes  # read on every call
        # The call `_serve` is answering (worker, request, call id, when it came), and what came of its answer:
        # `_on_result`, bound once, is handed to the gate instead of a closure made per call (2.2k instructions a
        # call less, callgrind). A nested call (a tool running a program here) saves and restores them.
        self._serving: tuple[WorkerProcess, CallRequest, str, float] | None = None
        self._answered: object = _UNANSWERED  # or None (sent), or what sending raised
        self._answered_at = 0.0
        self._on_result_cb = self._on_result
        #: ``(call_id, tool, value) -> value``: what the program gets instead of a tool's result (an agent
        #: swaps an image for a text handle here: the bytes stay on the host). None: the result as is.
        self.result_hook: Callable[[str, str, Any], Any] | None = None
        self._worker: WorkerProcess | None = None
        self._worker = self._start()
        self._ready(self._worker)

    # -- public ----------------------------------------------------------------------------------

    def __enter__(self) -> Interpreter:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        # The run it started ends as the block did: an error or Ctrl-C in the caller's code is not a run `done`.
        self._close("done" if kind is None else "error" if issubclass(kind, Exception) else "interrupted")

    def close(self) -> None:
        """Stop the worker; the interpreter cannot run programs afterwards (the run it started itself, with no
        `context=`, is finished: ``done``, or as its ``with`` block was left, ``error`` / ``interrupted``)."""
        self._close("done")

    def _close(self, status: str) -> None:
        with self._lock:
            self._closed = True
            if self._worker is not None:
                self._worker.close()
                self._worker = None
            if self._own_run and self.context is not None:
                # Nobody else can end the run it started: left open, `proctor audit verify` would say its
                # writer was killed or crashed.
                self._own_run = False
                self.gate.finish_run(self.context, status)

    def reset(self) -> None:
        """Replace the worker with a fresh one: no variable survives."""
        with self._lock:
            self._check_open()
            if self._worker is not None:
                self._worker.kill()
            self._worker = self._start()

    def run(self, code: str, *, context: RunContext | None = None, parent: Context | None = None,
            seed: int | None = None, variables: Mapping[str, Any] | None = None) -> ExecutionResult:
        """Run one program in the persistent namespace; never raises for anything the program does.

        `variables` are set in the namespace before the program starts, as the channel carries them
        (`proctor.interpreter.channel`: data, dates, Decimals, numpy, pandas and PIL objects); a value
        that cannot cross makes the run fail with a `SandboxError` naming it, before anything runs.

        `seed`, when given, seeds the worker's `random` before the program starts (durable runs
        re-run a step's program and need it to take the same path). A call the gate answers
        with a `StepInterrupted` (suspension, replay divergence) stops the program there: the
        worker is torn down and the result's `error` is that exception.
        """
        with self._lock:
            self._check_open()
            started = time.monotonic()
            lost, self._lost = self._lost, False
            calls: list[CallRecord] = []
            self._key = os.urandom(16).hex()
            try:
                message: dict[str, Any] = {"t": "run", "run": self._seq + 1, "code": str(code), "key": self._key}
                if seed is not None:
                    message["seed"] = int(seed)
                if variables:
                    bad = [n for n in variables if not isinstance(n, str) or not n.isidentifier() or n.startswith("__")]
                    if bad:
                        raise EncodeError(f"variable name {bad[0]!r} is not a plain identifier")
                    message["vars"] = encode_value(dict(variables), "variable")
                data = frame(message)
            except EncodeError as exc:
                self._lost = lost
                return ExecutionResult(None, "", SandboxError(f"the program cannot be sent to the worker: {exc}"),
                                       isolation=self.isolation)
            ctx = None
            spinning.enter()  # while another run is in progress in this process, nobody spins
            try:
                ctx = context or self._run_context()
                self._check_isolation(ctx)
                worker = self._ready(self._worker or self._start())
                self._seq += 1
                self._code = str(code)
                self._lines = None
                worker.logs.clear()
                worker.logs_cut = False
                worker.thaw()  # frozen since its last run: from here on its code runs under this deadline
                worker.write_left = None
                worker.send_bytes(data)
                result = self._drive(worker, ctx, parent, calls, started)
            except _Interrupted as stop:
                result = self._lose(str(stop.error), calls, error=stop.error)
            except ProtocolError as exc:
                result = self._violation(str(exc), calls, ctx)
            except WorkerDied:
                desc = self._worker.exit_description() if self._worker else "is gone"
                result = self._lose(f"the worker died: it {desc}", calls)
            except ProctorError as exc:  # SandboxError starting or talking to the worker; AuditError from start_run
                result = self._lose(str(exc), calls, error=exc) if isinstance(exc, SandboxError) else \
                    ExecutionResult(None, "", exc, tuple(calls), isolation=self.isolation)
            except BaseException as exc:  # Ctrl-C, or a bug: never leave a program running behind
                self._lose(f"interrupted: {type(exc).__name__}", calls)
                raise
            finally:
                spinning.leave()
            if lost and not result.state_lost:
                result = _replace(result, state_lost=True)
            return _replace(result, duration=time.monotonic() - started)

    # -- the step loop ---------------------------------------------------------------------------

    def _drive(self, worker: WorkerProcess, ctx: RunContext, parent: Context | None, calls: list[CallRecord],
               started: float) -> ExecutionResult:
        deadline = time.monotonic() + self.timeout
        final: list[Any] = []
        run = self._seq
        depth = self.channel_limits.max_depth
        # The protocol, from the host's side: after `run` the worker may send calls and one final
        # answer, all stamped with this run, then exactly one `done` carrying the run's key, and
        # nothing after it. An honest worker cannot do otherwise (it stops its threads' calls
        # before it reports, and refuses those of threads left from earlier programs), so any
        # other message means the program took over the channel: the worker is killed.
        while True:
            now = time.monotonic()
            if now >= deadline:
                return self._timed_out(calls, final)
            batch = worker.read(deadline - now)
            for i, (size, raw) in enumerate(batch):
                message = raw if type(raw) is OversizedCall else parse_worker_message(raw, depth)
                if isinstance(message, (CallRequest, OversizedCall)):
                    if message.run != run:
                        raise ProtocolError(f"call stamped with run {message.run} during run {run}")
                    began = time.monotonic()
                    if began >= deadline:  # requests after the deadline never reach the gate
                        return self._timed_out(calls, final)
                    worker.write_left = deadline - began  # a reply waits for the worker this long at most
                    if isinstance(message, OversizedCall):
                        self._refuse_oversized(worker, message, ctx, parent, calls)
                        continue
                    # Waiting on a tool or a human does not count. Refusals do: a program flooding
                    # the host with requests that are refused cannot stop its own clock that way.
                    deadline += self._serve(worker, message, ctx, parent, calls, bool(final), began, size)
                elif isinstance(message, Final):
                    if message.run != run:
                        raise ProtocolError(f"final answer stamped with run {message.run} during run {run}")
                    if final:
                        raise ProtocolError("a second final answer in one run")
                    final.append(message.value)
                    # The program is over; one that swallowed final_answer's exception gets a moment to finish.
                    deadline = min(deadline, time.monotonic() + FINAL_GRACE)
                elif isinstance(message, Done):
                    if message.run != run:
                        raise ProtocolError(f"done message for run {message.run}, expected {run}")
                    if message.key != self._key:
                        raise ProtocolError("done message without the run's key (written by the program, "
                                            "not the worker)")
                    if i + 1 < len(batch):
                        raise ProtocolError(f"{len(batch) - i - 1} message(s) after the run's done")
                    worker.freeze()  # nothing of the program runs until the next run starts
                    return self._finish(worker, message, calls, final)
                else:
                    raise ProtocolError("unexpected ready message during a run")

    def _serve(self, worker: WorkerProcess, req: CallRequest, ctx: RunContext, parent: Context | None,
               calls: list[CallRecord], after_final: bool, began: float, size: int) -> float:
        """Answer one request; return the seconds the program spent waiting for a tool or an
        approval (from `began` until the answer left), which do not count against its timeout."""
        seen = worker.seen_ids
        if not seen.take(req.id):
            raise ProtocolError(f"request id {req.id} used twice")
        refusal = None
        if after_final:
            refusal = "final_answer() was already called: the program may not call tools any more"
        elif req.tool not in self._names:
            refusal = f"unknown tool {req.tool!r} (this program can call: {', '.join(sorted(self._names))})"
        elif req.tool in self._unsendable:
            reason = f"{req.tool}: refused before it ran: {self._unsendable[req.tool]}"
            self._refuse_unread(worker, req.id, req.tool, reason, ctx, parent, calls, _sha256_of(req.args), size)
            return 0.0
        else:
            if ctx is not self._arg_run:
                self._arg_run, self._arg_bytes = ctx, 0
            # The frame's size less its envelope with one-digit ids: at most a few bytes over the
            # arguments' size, and cheap; the exact size is worked out only near the limit.
            used = self._arg_bytes + size - 45 - len(req.tool) - req.at_bytes
            if used > self._run_arg_limit:
                nbytes = call_args_bytes(size, req.id, req.run, req.tool, req.at_bytes)
                limit = self.channel_limits.max_run_arg_bytes
                if self._arg_bytes + nbytes > limit:
                    reason = (f"{req.tool}: refused: this run's calls have sent {size_text(self._arg_bytes)} of "
                              f"arguments, and this call's {size_text(nbytes)} would pass the run's limit of "
                              f"{size_text(limit)} (max_run_arg_bytes)")
                    self._refuse_unread(worker, req.id, req.tool, reason, ctx, parent, calls,
                                        _sha256_of(req.args), nbytes)
                    return 0.0
                used = self._arg_bytes + nbytes
            self._arg_bytes = used
        if refusal is not None:
            record = refused_record(new_id("call_"), req.tool, refusal)
            calls.append(record)
            log.warning("call_refused_by_interpreter", tool=req.tool, reason=refusal)
            self._reply(worker, req.id, error=ToolDenied(refusal, tool=req.tool, call_id=record.call_id))
            return 0.0
        call_id = new_id("call_")
        outer = self._serving, self._answered, self._answered_at
        self._serving, self._answered = (worker, req, call_id, began), _UNANSWERED
        try:
            outcome = self.gate.submit(req.tool, req.args, context=ctx, parent=parent, call_id=call_id,
                                       on_result=self._on_result_cb, position=self._checked(req.at))
        except Exception as exc:  # noqa: BLE001 - submit never raises by contract; if it does, refuse the call
            log.error("gate_submit_raised", tool=req.tool, error=repr(exc))
            record = refused_record(call_id, req.tool, f"the gate failed: {exc!r}")
            calls.append(record)
            if self._answered is _UNANSWERED:
                self._reply(worker, req.id, error=ToolDenied(record.error or "", tool=req.tool, call_id=call_id))
            return 0.0
        finally:
            answered, answered_at = self._answered, self._answered_at
            self._serving, self._answered, self._answered_at = outer
        record = outcome.record
        waited = record.status != "denied" or record.approval is not None or isinstance(outcome.error, ApprovalDenied)
        calls.append(record)
        if isinstance(outcome.error, StepInterrupted):
            raise _Interrupted(outcome.error)
        if answered is _UNANSWERED:  # refused before it ran
            answered_at = time.monotonic()
            self._answer(worker, req, call_id, outcome.value, outcome.error)
        elif answered is not None:
            raise cast(BaseException, answered)
        return answered_at - began if waited else 0.0

    def _checked(self, at: CallPosition | None) -> CallPosition | None:
        """The worker's report of where the call was made, if it lies inside the program it runs."""
        if at is None:
            return None
        if self._lines is None:
            self._lines = line_widths(self._code)
        return at.within(self._lines)

    def _on_result(self, value: Any, error: ProctorError | None) -> None:
        """The gate's `on_result` for the call `_serve` is answering: the program gets the tool's answer
        while the gate records the outcome (and runs again meanwhile: that time counts against its
        timeout, hence `_answered_at`). The clock runs again from the moment the answer is ready (a
        worker slow to read it spends its own time: `write_left`). What sending it raises is raised by
        `_serve` once the gate is done."""
        self._answered_at = time.monotonic()
        serving = self._serving
        if serving is None:  # not during a call of ours: nothing to answer
            return
        worker, req, call_id, began = serving
        # A call that took longer than the worker's spin window tells that the program's next call (in a
        # loop, most often the same tool: an MCP server's, a millisecond or more) will too: its reply lets
        # the worker block at once instead of polling SPIN_NS for an answer that cannot come within it
        # (CPU taken from the tool's own process on a small machine). A quick call's reply spins as before.
        spin = worker.spin and self._answered_at - began < _SPIN_S
        try:
            self._answer(worker, req, call_id, value, error, spin)
        except BaseException as exc:  # noqa: BLE001 - raised by `_serve`, once the gate is done
            self._answered = exc
        else:
            self._answered = None

    def _refuse_oversized(self, worker: WorkerProcess, call: OversizedCall, ctx: RunContext, parent: Context | None,
                          calls: list[CallRecord]) -> None:
        """A call refused by its size, before its arguments were decoded: audited with their digest."""
        if not worker.seen_ids.take(call.id):
            raise ProtocolError(f"request id {call.id} used twice")
        if call.what == "arguments":
            reason = (f"{call.tool}: refused: its arguments are {size_text(call.size)}, over the limit of "
                      f"{size_text(call.limit)} per call ({call.setting}); pass a smaller value, or a "
                      "reference to the data")
        else:
            reason = (f"{call.tool}: refused: its arguments hold {call.size:,} {call.what}, over the limit of "
                      f"{call.limit:,} ({call.setting})")
        self._refuse_unread(worker, call.id, call.tool, reason, ctx, parent, calls, call.sha256, call.size)

    def _refuse_unread(self, worker: WorkerProcess, rid: int, tool: str, reason: str, ctx: RunContext,
                       parent: Context | None,
                       calls: list[CallRecord], sha256: str | None, nbytes: int) -> None:
        call_id = new_id("call_")
        record = None
        try:
            outcome = self.gate.refuse(tool, reason, context=ctx, call_id=call_id, parent=parent, args_sha256=sha256,
                                       args_bytes=nbytes)
            record = outcome.record
        except Exception as exc:  # noqa: BLE001 - refused either way; the record says the gate failed
            log.error("gate_refuse_raised", tool=tool, error=repr(exc))
        if record is None:
            record = refused_record(call_id, tool, reason)
        calls.append(record)
        log.warning("call_refused_by_size", tool=tool, reason=reason)
        self._reply(worker, rid, error=ToolDenied(reason, tool=tool, call_id=call_id))

    def _answer(self, worker: WorkerProcess, req: CallRequest, call_id: str, value: Any,
                error: ProctorError | None, spin: bool | None = None) -> None:
        """Send the program the answer to `req`; `spin` (default: as this end polled) says whether the worker
        may poll while it waits for its next message."""
        spin = worker.spin if spin is None else spin
        if error is not None:
            self._reply(worker, req.id, error=error, spin=spin)
            return
        hook = self.result_hook
        if hook is not None:
            try:
                value = hook(call_id, req.tool, value)
            except Exception as exc:  # noqa: BLE001 - the tool ran; the program gets why its result did not come
                self._reply(worker, req.id, error=ToolFailed(f"{req.tool}: ran, but its result could not be passed "
                                                             f"on: {exc}", tool=req.tool, call_id=call_id,
                                                             error_type=type(exc).__name__), spin=spin)
                return
        try:
            data = reply_frame(req.id, value if type(value) in SCALAR_TYPES else encode_value(value, "result"),
                               spin)
        except EncodeError as exc:
            failed = ToolFailed(f"{req.tool}: ran, but its {exc}", tool=req.tool, call_id=call_id,
                                error_type="EncodeError")
            self._reply(worker, req.id, error=failed, spin=spin)
            return
        worker.send_bytes(data)

    @staticmethod
    def _reply(worker: WorkerProcess, rid: int, *, error: ProctorError, spin: bool | None = None) -> None:
        message = {"t": "reply", "id": rid, "ok": False, "error": error_payload(error)}
        if not (worker.spin if spin is None else spin):
            message["spin"] = False
        worker.send(message)

    def _finish(self, worker: WorkerProcess, done: Done, calls: list[CallRecord], final: list[Any]) -> ExecutionResult:
        worker.drain_logs()
        logs = self._logs(worker, cut=done.cut)
        is_final = done.final or bool(final)
        value = final[0] if final else done.value
        error = None
        if done.error is not None and not is_final:
            error = ProgramError(done.error["type"], done.error["message"], done.error["line"],
                                 source=_source_line(self._code, done.error["type"], done.error["line"]))
        return ExecutionResult(value, logs, error, tuple(calls), is_final, isolation=self.isolation)

    def _timed_out(self, calls: list[CallRecord], final: list[Any]) -> ExecutionResult:
        error = ExecutionTimeout(f"the program ran longer than {self.timeout:g}s and was stopped; "
                                 "its variables are lost and the next run starts fresh")
        result = self._lose(str(error), calls, error=error)
        if final:  # final_answer() ended the program; the worker kept going after it and was stopped
            result = _replace(result, value=final[0], is_final_answer=True, error=None)
        return result

    def _violation(self, reason: str, calls: list[CallRecord], ctx: RunContext | None) -> ExecutionResult:
        """The worker broke the protocol: record it in the audit trail, kill it, end the run."""
        worker = self._worker
        fields = {"run_id": ctx.info.id if ctx is not None else None, "reason": reason[:2000],
                  "isolation": self.isolation, "host_pid": worker.proc.pid if worker is not None else None}
        log.error("protocol_violation", **fields)
        audit = self.gate.audit
        if audit is not None:
            written: AuditResult | None
            try:
                written = audit.append("protocol_violation", fields)
            except Exception as exc:  # noqa: BLE001 - the run ends either way; say the record is missing
                written = None
                log.error("audit_write_failed", kind="protocol_violation", error=repr(exc))
            if written is not None and not written.ok:
                log.error("audit_write_failed", kind="protocol_violation", error=written.error)
        return self._lose(f"protocol violation: the worker broke the channel protocol and was stopped: {reason}",
                          calls)

    def _lose(self, message: str, calls: list[CallRecord], *, error: ProctorError | None = None) -> ExecutionResult:
        """Kill the worker (its state is gone), start the next one in the background, report why."""
        worker, self._worker = self._worker, None
        logs = ""
        if worker is not None:
            worker.kill()
            logs = self._logs(worker, cut=False)
        self._lost = True
        if not self._closed:
            try:
                self._worker = self._start()
            except SandboxError as exc:
                log.error("worker_restart_failed", error=str(exc))
        if isinstance(error, StepInterrupted):  # by design (a suspension, a replay that diverged): not a fault
            log.info("worker_stopped", reason=message)
        else:
            log.warning("worker_lost", reason=message)
        return ExecutionResult(None, logs, error or SandboxError(message), tuple(calls), state_lost=True,
                               isolation=self.isolation)

    def _logs(self, worker: WorkerProcess, *, cut: bool) -> str:
        text = worker.logs.decode("utf-8", "replace")
        if cut or worker.logs_cut or len(text) > self.max_output:
            text = text[: self.max_output] + f"\n[output truncated: more than {self.max_output} characters]"
        return text

    # -- workers ---------------------------------------------------------------------------------

    def _choose_isolation(self, sandbox: str) -> str:
        if sandbox in ("process", "none"):
            return "process"
        ok, reason, _ = bwrap_status()
        if ok:
            return "bwrap"
        if sandbox == "bwrap":
            raise SandboxError(f"sandbox='bwrap' but {reason}: {INSTALL_HINT}")
        log.warning("sandbox_unavailable", reason=reason, isolation="process",
                    message="PROCESS-ONLY ISOLATION: model code can read files and use the network "
                            f"of this machine's user; {INSTALL_HINT}")
        return "process"

    def _start(self) -> WorkerProcess:
        return WorkerProcess(self._spec, self._init, log_cap=self.max_output * 4 + 1024, limits=self.channel_limits)

    def _channel_limits(self, max_arg_bytes: int, max_run_arg_bytes: int, max_frame_bytes: int, max_depth: int,
                        max_containers: int, max_values: int) -> ChannelLimits:
        """The host's bounds for this interpreter's workers; the policy's `tools:` may set a tool's own
        argument limit, and the frame limit grows to fit the largest argument limit."""
        per_tool: dict[str, int] = {}
        policy = self.gate.policy
        for t in self.tools:
            try:
                limit = facts_of(policy, t.name, t.side_effect, t.cost).max_arg_bytes
            except Exception:  # noqa: BLE001 - no facts: the interpreter's limit applies
                limit = None
            if type(limit) is int and limit > 0:
                per_tool[t.name] = limit
        try:
            largest = max([max_arg_bytes, *per_tool.values()])
            return ChannelLimits(max(max_frame_bytes, largest + 4096), max_depth, max_containers, max_values,
                                 max_arg_bytes, max_run_arg_bytes, per_tool)
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"Interpreter limits: {exc}") from None

    def _ready(self, worker: WorkerProcess) -> WorkerProcess:
        if worker.ready_at is not None:
            return worker
        end = time.monotonic() + self.start_timeout
        try:
            while True:
                left = end - time.monotonic()
                if left <= 0:
                    raise SandboxError(f"the worker did not start within {self.start_timeout:g}s")
                for _, raw in worker.read(left):
                    if type(raw) is OversizedCall:
                        raise ProtocolError("a call before the worker was ready")
                    message = parse_worker_message(raw)
                    if not isinstance(message, Ready):
                        raise ProtocolError(f"expected ready, got {type(message).__name__}")
                    worker.pid, worker.ready_at = message.pid, time.perf_counter()
                    self._audit_start(worker)
                    return worker
        except (WorkerDied, ProtocolError) as exc:
            worker.kill()
            raise SandboxError(f"the worker failed to start: it {worker.exit_description()} ({exc})") from None
        except SandboxError:
            worker.kill()
            raise

    def _audit_start(self, worker: WorkerProcess) -> None:
        start_ms = round((worker.ready_at or worker.started) * 1000 - worker.started * 1000, 1)
        fields = {"isolation": self.isolation, "sandbox": self.sandbox, "host_pid": worker.proc.pid,
                  "start_ms": int(start_ms), "memory_limit": self._limits.get("RLIMIT_AS"),
                  "authorized_imports": list(self.authorized_imports)}
        log.debug("worker_started", **fields)
        audit = self.gate.audit
        if audit is not None:
            result = audit.append("worker_started", fields, durable=False)
            if not result.ok:
                log.error("audit_write_failed", kind="worker_started", error=result.error)

    def _check_isolation(self, ctx: RunContext) -> None:
        """The policy deciding the run may say `sandbox: required` since this interpreter chose its isolation (a
        reloaded policy file): then no program of it runs outside bubblewrap (SandboxError, naming the fix)."""
        if self.isolation != "bwrap" and self.gate.policy_for(ctx).model.sandbox == "required":
            require_bwrap(self.sandbox)  # raises: sandbox="process" was asked for, or bubblewrap cannot run here
            raise SandboxError("the policy now says `sandbox: required` (bubblewrap), but this interpreter's workers "
                               "run as plain processes: make a new Interpreter (or agent) to run under bubblewrap")

    def _run_context(self) -> RunContext:
        if self.context is None:
            self.context = self.gate.start_run()
            self._own_run = True
        return self.context

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("this interpreter is closed")


def check_installed(names: Iterable[str]) -> None:
    """Refuse, at construction, an authorized import that names a module not installed here."""
    missing = []
    for name in names:
        top = name.partition(".")[0]
        if name == "*" or top in STDLIB:
            continue
        try:
            found = importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(top)
    if missing:
        raise ConfigurationError(f"authorized_imports names {', '.join(sorted(set(missing)))}, not installed in this "
                                 "Python: install it or remove it from authorized_imports")


def _source_line(code: str, type_name: str, line: int | None) -> str | None:
    """The program's line `line` (what failed), stripped and cut to 200 characters; None for a SyntaxError,
    whose message already shows the line with a caret."""
    if line is None or type_name in ("SyntaxError", "IndentationError", "TabError"):
        return None
    lines = code.splitlines()
    if not 0 < line <= len(lines):
        return None
    text = lines[line - 1].strip()
    return (text[:200] + "…" if len(text) > 200 else text) or None


class _Interrupted(Exception):
    """The gate stopped the program at a call (`StepInterrupted`): no answer goes back to it."""

    def __init__(self, error: StepInterrupted) -> None:
        super().__init__(str(error))
        self.error = error


def _replace(result: ExecutionResult, **changes: Any) -> ExecutionResult:
    return replace(result, **changes)


def _return_type(t: Tool) -> Any:
    """What `t` says it returns: its signature's annotation, resolved when it is text (postponed annotations)."""
    annotation = t.signature.return_annotation
    if isinstance(annotation, str):
        try:
            annotation = typing.get_type_hints(t.fn).get("return", annotation)
        except Exception:  # noqa: BLE001 - a name that does not resolve says nothing about the result
            return None
    return annotation


def _sha256_of(args: Any) -> str | None:
    """sha256 of the canonical JSON of decoded arguments (None if they have no canonical form)."""
    try:
        return canonical_sha256(args)
    except Exception:  # noqa: BLE001 - the refusal stands without a digest
        return None
