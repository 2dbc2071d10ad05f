"""``proctor mcp serve``: a governed code-mode MCP server (see docs/code-mode.md).

The client's model is offered three tools instead of every upstream definition:

- ``run_python(code)`` runs the program in proctor's sandboxed `Interpreter`, where every upstream
  MCP tool (named ``<server>_<tool>``) and every local ``--tools`` tool is a Python function; each
  call goes through one `Gate` (policy, budgets, approval, audit, span). The namespace lasts for the
  MCP session. The result is the program's output, its last value and a table of its calls.
- ``search_tools(query)`` and ``describe_tool(name)``: Python signatures and docstrings rendered
  from the upstream schemas (`proctor.signatures`), so definitions are read only when needed.

One MCP session is one run (`Gate.start_run`): its principal is the HTTP bearer token's owner (or
the configured user on stdio); budgets, history and the audit run id span its ``run_python``
calls; the session's end is ``run_finished``. A call that needs approval asks the client's user
through MCP elicitation when the client declared it, else the configured approver; with neither,
the call is denied, saying why.
"""

import asyncio
import inspect
import io
import json
import os
import re
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pydantic

from proctor.approval.base import ApprovalDecision, ApprovalRequest, Approver, CheckingApprover
from proctor.audit.base import AuditSink
from proctor.calls import CallPosition, source_lines
from proctor.codemode.config import ServerConfig
from proctor.errors import ConfigurationError, ToolsetError
from proctor.integrations.mcp import MCP_MAJOR, MCPToolset
from proctor.interrupts import Terminated, interruption
from proctor.policy.approvers import Answerer, refusal
from proctor.serve.guard import RequestGuard, json_bodies
from proctor.store.answerseal import AnswerCheck
from proctor.termsafe import marked_plain, terminal_safe, text_safe
from proctor.tools import Tool
from proctor.urls import shown_url

if TYPE_CHECKING:
    from proctor.gate.gate import PolicyLike
    from proctor.gate.run import RunContext
    from proctor.halt import HaltChannel
    from proctor.interpreter import Interpreter
    from proctor.ledger.base import SharedLedger
    from proctor.policy.reload import PolicySource

if MCP_MAJOR >= 2:
    from mcp.server.mcpserver import Context
    from mcp.server.mcpserver import MCPServer as SDKServer
else:  # 1.x: the same high-level server, named FastMCP
    from mcp.server.fastmcp import Context  # type: ignore[no-redef,attr-defined]
    from mcp.server.fastmcp import FastMCP as SDKServer  # type: ignore[no-redef,attr-defined]

from mcp import StdioServerParameters

if sys.version_info >= (3, 11):
    _Group = BaseExceptionGroup  # noqa: F821 - a builtin from 3.11 (ruff reads the 3.10 floor)
else:  # 3.10: anyio's dependency, the backport its task groups raise
    from exceptiongroup import BaseExceptionGroup as _Group

__all__ = ["BearerAuth", "CodeMode", "CodeModeSession", "ElicitingApprover", "render_result", "serve_http",
           "serve_stdio"]

_VALUE_CAP = 4000
#: The most calls a result's table lists (the model's context is what code mode saves), and how many of
#: them are kept for calls that simply ran when more than the rest did not.
_CALL_ROWS = 50
_PLAIN_ROWS = 10
_LOG_CAP = 20_000
#: Seconds without a request after which an HTTP session's run is ended (the SDK's own default).
DEFAULT_SESSION_IDLE = 1800.0
#: The most HTTP sessions one principal may hold open at once (a client opens one; a few clients, a few more).
DEFAULT_MAX_SESSIONS_PER_PRINCIPAL = 16
#: The largest request body `serve_http` takes: a program no larger than the sandboxed worker's channel carries.
DEFAULT_MAX_BODY = 16 * 1024 * 1024
_REAPED_KEPT = 10_000
_SEARCH_HITS = 10
#: The most characters of a description's first line a search_tools hit shows.
_SUMMARY_CAP = 160
#: The longest arguments (as shown) an elicitation prompt carries; longer ones go to --approver (or are denied).
_PROMPT_ARGS_CAP = 20_000
#: The most characters of the program line an elicitation prompt shows (a window from the call's column).
_LINE_SHOWN = 300


class _Answer(pydantic.BaseModel):
    """What the client's user is asked to fill in (MCP elicitation takes flat, primitive fields)."""

    approve: bool = pydantic.Field(description="Run this call?")
    reason: str = pydantic.Field(default="", description="Why (recorded in the audit trail)")


@dataclass
class CodeModeSession:
    """One MCP session: its run, its interpreter (made at its first program) and how to reach its user."""

    key: str
    principal: str
    run: "RunContext"
    interpreter: "Interpreter | None" = None
    #: While a program runs: ``(loop, ctx)`` of its ``run_python`` request, to elicit approvals on.
    current: tuple[asyncio.AbstractEventLoop, Any] | None = None
    can_elicit: bool = False
    code: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    programs: int = 0
    finished: bool = False
    #: `time.monotonic()` of the session's last request (its start or a program's end).
    last_active: float = field(default_factory=time.monotonic)


class ElicitingApprover:
    """The gate's approver: asks the session's user through MCP elicitation when its client declared
    it, else `fallback`; with neither, denies saying why. `timeout_s` caps the wait (the request's
    own expiry caps it too; None: the expiry alone)."""

    def __init__(self, code_mode: "CodeMode", fallback: Approver | None, timeout_s: float | None) -> None:
        self.code_mode, self.fallback, self.timeout_s = code_mode, fallback, timeout_s

    def request(self, request: ApprovalRequest) -> ApprovalDecision:
        return self.request_checked(request, AnswerCheck(None, None))

    def request_checked(self, request: ApprovalRequest, answers: AnswerCheck) -> ApprovalDecision:
        """As `request`; a fallback that reads answers from a run store (an inbox) is handed the gate's check."""
        session = self.code_mode.session_of(request.run.id)
        current = session.current if session is not None else None
        # The client's user is the session's principal, proven by nothing but the session: where the policy's
        # `approvers:` would refuse them (four eyes, groups, users) they are not asked; the fallback is.
        barred = refusal(Answerer(session.principal, "mcp-elicitation", None), request.approvers,
                         request.run.principal) if session is not None else None
        if barred is None and len(shown_args(request)) > _PROMPT_ARGS_CAP:  # nobody approves what they cannot see
            barred = f"its arguments are too long to show whole in the client (over {_PROMPT_ARGS_CAP} characters)"
        if session is None or current is None or not session.can_elicit or barred is not None:
            if isinstance(self.fallback, CheckingApprover):
                return self.fallback.request_checked(request, answers)
            if self.fallback is not None:
                return self.fallback.request(request)
            why = f"the MCP client's user cannot answer it ({barred})" if barred is not None else \
                "the MCP client does not support elicitation"
            return ApprovalDecision.deny(request, "mcp-elicitation", f"approval needed, but {why} and proctor mcp "
                                         "serve has no --approver")
        loop, ctx = current
        expires_in = max(0.0, (request.expires_at_ns - time.time_ns()) / 1e9)
        limit = expires_in if self.timeout_s is None else min(self.timeout_s, expires_in)
        who = f"mcp-elicitation:{session.principal}"
        future = asyncio.run_coroutine_threadsafe(ctx.elicit(prompt(request, session.code), _Answer), loop)
        try:
            result = future.result(limit)
        except TimeoutError:
            future.cancel()
            return ApprovalDecision.deny(request, "timeout", f"no answer through MCP elicitation within {limit:.1f}s",
                                         timed_out=True)
        except Exception as exc:  # noqa: BLE001 - a channel error is a deny that names it
            return ApprovalDecision.deny(request, who, f"MCP elicitation failed: {type(exc).__name__}: {exc}"[:500])
        action = str(getattr(result, "action", ""))
        data = getattr(result, "data", None)
        reason = str(getattr(data, "reason", "") or "")[:500]
        if action == "accept" and isinstance(data, _Answer) and data.approve:
            return ApprovalDecision.approve(request, who, reason, method="mcp-elicitation")
        if action == "accept" and isinstance(data, _Answer):
            return ApprovalDecision.deny(request, who, reason or "denied by the user", method="mcp-elicitation")
        return ApprovalDecision.deny(request, who, reason or f"the user did not answer ({action or 'no action'})",
                                     method="mcp-elicitation")


def shown_args(request: ApprovalRequest) -> str:
    """The arguments as the client's user reads them: whole, escaped and with look-alikes spelled out as
    `proctor approvals show` writes them (`proctor.termsafe.marked_plain`)."""
    return marked_plain(json.dumps(dict(request.args), ensure_ascii=False, default=str, sort_keys=True))


def prompt(request: ApprovalRequest, code: str) -> str:
    """The question shown to the client's user: tool, arguments (escaped, whole), program line, reason."""
    line = program_line(code, request.position)
    parts = [f"proctor: a program wants to call {marked_plain(request.tool)} ({request.side_effect})",
             f"arguments: {shown_args(request)}"]
    if line is not None:
        parts.append(f"program line {line[0]}: {marked_plain(line[1])}")
    parts.append(f"why approval is needed: {terminal_safe(request.reason or ', '.join(request.rules))}")
    return "\n".join(parts)


def program_line(code: str, position: CallPosition | None) -> tuple[int, str] | None:
    """The line of `code` the worker reported the call at (number, text), or None when it reported none.
    Never found by the tool's name: a program calling one tool on two lines would show the wrong one.
    A line too long to show whole is shown from the call's column (``…`` marking what is left out), so
    a padded statement or an earlier call on the line cannot fill the part the user reads."""
    if position is None:
        return None
    lines = source_lines(code)
    if not 1 <= position.line <= len(lines):
        return None
    text = lines[position.line - 1].rstrip()
    lead = len(text) - len(text.lstrip())
    if len(text) - lead <= _LINE_SHOWN:
        return position.line, text.strip()
    # The column is in UTF-8 bytes (as `ast` counts); the window is cut in characters.
    call = len(text.encode("utf-8")[:position.col].decode("utf-8", "ignore")) if position.col is not None else lead
    begin = max(lead, min(call, len(text) - _LINE_SHOWN))
    end = begin + _LINE_SHOWN
    return position.line, ("…" if begin > lead else "") + text[begin:end] + ("…" if end < len(text) else "")


class CodeMode:
    """The state behind ``proctor mcp serve``: one gate, the upstream toolsets, the sessions."""

    def __init__(self, servers: Sequence[ServerConfig], policy: "PolicyLike | PolicySource", *,
                 local_tools: Iterable[Tool] = (),
                 audit: AuditSink | None = None, approver: Approver | None = None, user: str | None = None,
                 sandbox: str = "auto", timeout: float = 30.0, authorized_imports: Iterable[str] = (),
                 session_idle: float | None = DEFAULT_SESSION_IDLE, halts: "HaltChannel | None" = None,
                 shadow: "PolicyLike | None" = None, ledger: "SharedLedger | str | None" = None,
                 labels: Mapping[str, str] | None = None,
                 max_sessions_per_principal: int | None = DEFAULT_MAX_SESSIONS_PER_PRINCIPAL) -> None:
        from proctor.gate import Gate

        if session_idle is not None and not session_idle > 0:
            raise ConfigurationError(f"session_idle must be a positive number of seconds, not {session_idle!r}")
        if max_sessions_per_principal is not None and (
                not isinstance(max_sessions_per_principal, int) or max_sessions_per_principal < 1):
            raise ConfigurationError("max_sessions_per_principal must be a positive whole number of sessions, not "
                                     f"{max_sessions_per_principal!r}")

        self.servers = list(servers)
        self.local_tools = list(local_tools)
        self.user = user or os.environ.get("USER") or "stdio"
        self.sandbox, self.timeout = sandbox, float(timeout)
        self.authorized_imports = tuple(authorized_imports)
        self.session_idle = session_idle
        #: HTTP: the most sessions a principal may hold open (opened, not yet ended or reaped); None: no bound.
        self.max_sessions_per_principal = max_sessions_per_principal
        #: The upstream tools not offered, by name: why (`MCPToolset.withheld`, with the server named).
        self.withheld: dict[str, str] = {}
        #: The labels of every session's run (`run.labels` in conditions); `via` is always this server's.
        self.labels = {**(labels or {}), "via": "mcp-code-mode"}
        self.toolsets: list[MCPToolset] = []
        self.tools: list[Tool] = []
        self._sessions: dict[str, CodeModeSession] = {}
        self._by_run: dict[str, CodeModeSession] = {}
        # Keys of sessions ended for idleness: a late request on one is told so instead of opening a
        # second run under the same key. Bounded: the oldest are forgotten first.
        self._reaped: dict[str, str] = {}
        # HTTP sessions by the principal that opened them (initialize), before any program makes them a run:
        # key -> (principal, monotonic time of its last request). Another token gets 403 on them from the start.
        self._claims: dict[str, tuple[str, float]] = {}
        # HTTP requests being served per session key (an open GET event stream is one): the SDK keeps a session
        # with one in flight however long, so it is not idle, and whom it belongs to must not be forgotten.
        self._in_flight: dict[str, int] = {}
        # Sessions being opened per principal (an initialize admitted, its session id not yet claimed): counted
        # with the open ones, so two initializes at once cannot both take the last place.
        self._opening: dict[str, int] = {}
        self._lock = threading.Lock()
        # A `PolicySource` (a policy file) is reloaded when it changes (`proctor.policy.reload`); the approver's
        # wait is each request's own expiry, which the policy deciding the call set.
        self.approver = ElicitingApprover(self, approver, None)
        # `halts`: the fleet's halt channel (`proctor halt --ledger/--store`); None: this process's own.
        # `shadow`: a candidate policy deciding every call beside `policy`, never acting (docs/operations.md).
        # `ledger`: where budgets counted across runs live (per principal: across a user's sessions), as for `run`.
        self.gate = Gate(policy, approver=self.approver, audit=audit, halts=halts, shadow=shadow, ledger=ledger)

    # -- lifecycle -------------------------------------------------------------------------------

    def open(self) -> None:
        """Start every upstream server and list its tools (a failure stops everything, naming the server)."""
        taken = {t.name for t in self.local_tools} | {"run_python", "search_tools", "describe_tool"}
        try:
            for s in self.servers:
                server: StdioServerParameters | str
                if s.url is not None:
                    server = s.url
                else:
                    assert s.command is not None
                    server = StdioServerParameters(command=s.command, args=list(s.args),
                                                   env=dict(s.env) if s.env is not None else None, cwd=s.cwd)
                toolset = MCPToolset(server, name=s.name, prefix=s.prefix, headers=s.headers, timeout=s.timeout,
                                     call_timeout=s.call_timeout, trust_annotations=s.trust_annotations,
                                     reserved=taken)
                self.toolsets.append(toolset)
                try:
                    tools = toolset.open()
                except ToolsetError as exc:  # say which entry, reaching what, and the way out
                    target = shown_url(s.url) if s.url is not None else " ".join([s.command or "", *s.args])
                    raise ToolsetError(f"server {s.name!r} ({target}) did not start: {exc}; fix its entry, or set "
                                       '"disabled": true to serve without it') from exc
                taken |= {t.name for t in tools}
                self.tools.extend(tools)
                self.withheld.update({name: f"{why} (MCP server {s.name})" for name, why in toolset.withheld.items()})
        except ToolsetError:
            self.close()
            raise
        self.tools.extend(self.local_tools)
        # A name one server lists but cannot have offered, and another server (or a local tool) offers, is that
        # other tool's: search_tools and describe_tool speak of the tool a program would call.
        offered = {t.name for t in self.tools}
        self.withheld = {name: why for name, why in self.withheld.items() if name not in offered}
        self.gate.register(*self.tools)

    def close(self, status: str = "done", **fields: Any) -> None:
        """End every session (``run_finished`` with `status`) and stop the upstream servers."""
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            self.end_session(session.key, status, **fields)
        for toolset in self.toolsets:
            toolset.close()
        self.toolsets = []

    # -- sessions ---------------------------------------------------------------------------------

    def session(self, key: str, principal: str) -> CodeModeSession:
        """The session `key`, opened (a run started) at its first request."""
        session = self.session_or_ended(key, principal)
        if isinstance(session, str):
            raise ConfigurationError(session)
        return session

    def session_or_ended(self, key: str, principal: str) -> CodeModeSession | str:
        """The session `key` (opened at its first request), or why it can serve no more requests."""
        with self._lock:
            session = self._sessions.get(key)
            if session is not None:
                if session.principal != principal:
                    raise ConfigurationError("this MCP session belongs to another principal")
                session.last_active = time.monotonic()
                return session
            if key in self._reaped:
                return self._reaped[key]
            claim = self._claims.get(key)
            if claim is not None and claim[0] != principal:
                raise ConfigurationError("this MCP session belongs to another principal")
            run = self.gate.start_run(principal=principal, labels=self.labels, agent="mcp-code-mode")
            session = CodeModeSession(key, principal, run)
            self._sessions[key] = session
            self._by_run[run.info.id] = session
            return session

    def owner(self, key: str) -> str | None:
        """The principal of session `key` (the one that opened it), or None when there is no such session."""
        with self._lock:
            session = self._sessions.get(key)
            if session is not None:
                return session.principal
            claim = self._claims.get(key)
            if claim is None:
                return None
            self._claims[key] = (claim[0], time.monotonic())
            return claim[0]

    def claim(self, key: str, principal: str, admitted: bool = False) -> None:
        """Session `key` was opened by `principal` (HTTP: its initialize), before it runs any program; `admitted`:
        the place `admit` reserved for it is now this session's."""
        with self._lock:
            self._claims[key] = (principal, time.monotonic())
            if admitted:
                self._unreserve(principal)

    def admit(self, principal: str) -> str | None:
        """Reserve a place for a session `principal` is opening (HTTP: an initialize), or say why there is none:
        they hold `max_sessions_per_principal` open already. A reserved place is the session's once it is claimed
        (`claim(..., admitted=True)`), else given back with `not_opened`."""
        limit = self.max_sessions_per_principal
        with self._lock:
            if limit is not None:
                held = {k for k, (who, _) in self._claims.items() if who == principal}
                held |= {k for k, session in self._sessions.items() if session.principal == principal}
                if len(held) + self._opening.get(principal, 0) >= limit:
                    idle = f"after --session-idle ({self.session_idle:g}s without a request)" \
                        if self.session_idle is not None else "when the server stops (--session-idle is off)"
                    return (f"{principal} already has {len(held)} open MCP sessions, the most "
                            f"--max-sessions-per-principal allows ({limit}): end one (its client closes it, or "
                            f"DELETE /mcp with its Mcp-Session-Id), or an idle one is ended {idle}")
            self._opening[principal] = self._opening.get(principal, 0) + 1
        return None

    def not_opened(self, principal: str) -> None:
        """The initialize `admit` reserved a place for opened no session: the place is free again."""
        with self._lock:
            self._unreserve(principal)

    def _unreserve(self, principal: str) -> None:
        left = self._opening.get(principal, 0) - 1
        if left > 0:
            self._opening[principal] = left
        else:
            self._opening.pop(principal, None)

    def request_began(self, key: str) -> None:
        """An HTTP request on session `key` is being served: the session is not idle until it ends."""
        with self._lock:
            self._in_flight[key] = self._in_flight.get(key, 0) + 1

    def request_ended(self, key: str) -> None:
        """An HTTP request on session `key` ended: its idle time counts from now (as the SDK's does)."""
        now = time.monotonic()
        with self._lock:
            left = self._in_flight.get(key, 1) - 1
            if left > 0:
                self._in_flight[key] = left
            else:
                self._in_flight.pop(key, None)
            session = self._sessions.get(key)
            if session is not None:
                session.last_active = max(session.last_active, now)
            claim = self._claims.get(key)
            if claim is not None:
                self._claims[key] = (claim[0], now)

    def session_of(self, run_id: str) -> CodeModeSession | None:
        with self._lock:
            return self._by_run.get(run_id)

    def end_session(self, key: str, status: str = "done", **fields: Any) -> None:
        """The session's end: its run is finished and its interpreter stopped."""
        with self._lock:
            session = self._sessions.pop(key, None)
            self._claims.pop(key, None)
            if session is not None:
                self._by_run.pop(session.run.info.id, None)
        if session is None:
            return
        with session.lock:
            session.finished = True
            if session.interpreter is not None:
                session.interpreter.close()
            self.gate.finish_run(session.run, status, programs=session.programs, **fields)

    def reap_idle(self, now: float | None = None) -> list[str]:
        """End the sessions that had no request for `session_idle` seconds, have none in flight (an open
        event stream holds a session, as it does for the SDK) and run no program now (a client that
        vanished without deleting its session): ``run_finished`` with status ``abandoned``. Returns their keys."""
        if self.session_idle is None:
            return []
        now = time.monotonic() if now is None else now
        with self._lock:  # a session opened but never used is forgotten when the SDK forgets its transport
            for key in [k for k, (_, seen) in self._claims.items()
                        if now - seen >= self.session_idle and not self._in_flight.get(k)]:
                del self._claims[key]
            idle = [s for s in self._sessions.values()
                    if now - s.last_active >= self.session_idle and s.current is None and not s.lock.locked()
                    and not self._in_flight.get(s.key)]
        reason = f"no request for {self.session_idle:g}s: the client went away without ending its session"
        ended = []
        for session in idle:
            with self._lock:
                self._reaped[session.key] = f"this MCP session was ended after {self.session_idle:g}s without " \
                                            "a request; start a new one"
                while len(self._reaped) > _REAPED_KEPT:
                    del self._reaped[next(iter(self._reaped))]
            self.end_session(session.key, "abandoned", reason=reason)
            ended.append(session.key)
        return ended

    # -- the three tools ---------------------------------------------------------------------------

    def run_python(self, session: CodeModeSession, code: str,
                   asker: tuple[asyncio.AbstractEventLoop, Any] | None = None, can_elicit: bool = False) -> str:
        """Run one program in the session's namespace; the text the client's model reads. `asker`: the
        ``(loop, ctx)`` of the ``run_python`` request, whose client approvals are elicited from when it
        `can_elicit`; set only while this program runs (a second request of the session waits for the first)."""
        from proctor.interpreter import Interpreter

        with session.lock:
            if session.finished:
                return "error: this MCP session has ended; start a new one"
            session.current, session.can_elicit = asker, can_elicit
            if session.interpreter is None:
                session.interpreter = Interpreter(self.tools, self.gate, timeout=self.timeout,
                                                  sandbox=self.sandbox,  # type: ignore[arg-type]
                                                  authorized_imports=self.authorized_imports, context=session.run)
            session.code = code
            session.programs += 1
            try:
                result = session.interpreter.run(code, context=session.run)
            finally:
                session.current = None
                session.last_active = time.monotonic()
        # What the client's model reads leaves this process: no redacted argument's value in clear (the program
        # keeps it in its variables for later calls). Scrubbed first: escaping could hide a value from the scrub.
        return text_safe(session.run.scrub(render_result(result)))

    def search(self, query: str) -> str:
        words = [w for w in re.findall(r"\w+", query.lower()) if w]
        scored: list[tuple[int, str, Tool]] = []
        for t in self.tools:
            text = f"{t.name} {t.description}".lower()
            score = sum(3 if w in t.name.lower() else 1 for w in words if w in text) if words else 1
            if score:
                scored.append((score, t.name, t))
        scored.sort(key=lambda x: (-x[0], x[1]))
        lines = [f"{t.signature_text()}  # {_summary(t.description)}" for _, _, t in scored[:_SEARCH_HITS]]
        # A listed tool that is not offered is named where a search finds it, so the model is not left guessing.
        withheld = sorted(n for n in self.withheld if not words or any(w in n.lower() for w in words))
        note = (f"\nnot offered (their server's schemas cannot be used; describe_tool(name) says why): "
                f"{', '.join(withheld[:_SEARCH_HITS])}" + (" …" if len(withheld) > _SEARCH_HITS else "")) \
            if withheld else ""
        if not lines:
            return f"no tool matches {terminal_safe(query)!r}; {len(self.tools)} tools in all (search_tools('') " \
                   f"lists some){note}"
        more = len(scored) - len(lines)
        tail = f"\n({more} more match; narrow the query)" if more > 0 else ""
        return ("\n".join(lines) + tail + note
                + "\n\ndescribe_tool(name) shows one tool's full signature and docstring.")

    def describe(self, name: str) -> str:
        from proctor.agent.prompts import describe_tools

        tool = next((t for t in self.tools if t.name == name), None)
        if tool is None and name in self.withheld:
            return f"{name} is not offered: {self.withheld[name]}"
        if tool is None:
            close = [t.name for t in self.tools if name.lower() in t.name.lower()][:5]
            hint = f"; did you mean {', '.join(close)}?" if close else "; search_tools(query) finds tools"
            return f"no tool named {terminal_safe(name)!r}{hint}"
        origin = f"\n# from {tool.origin}" if tool.origin else ""
        return describe_tools([tool], self.policy) + origin

    @property
    def policy(self) -> "PolicyLike":
        """The policy in force now (a reloaded file's current one)."""
        return self.gate.policy

    # -- the MCP server ----------------------------------------------------------------------------

    def build_server(self, principal_of: Callable[[Any], str], key_of: Callable[[Any], str],
                     host: str = "127.0.0.1") -> SDKServer:
        """The SDK's server offering the three tools; `principal_of(ctx)`/`key_of(ctx)` name a request's
        principal and session. `host`: the address HTTP is served on (mcp 1.x reads it here)."""
        servers = ", ".join(s.name for s in self.servers) or "none"
        instructions = ("Write Python with run_python: every tool of the upstream servers "
                        f"({servers}) and the local tools is a function there, each call governed by proctor's "
                        "policy. Find functions with search_tools(query); read one with describe_tool(name). "
                        "Variables persist between run_python calls of this session.")
        if MCP_MAJOR >= 2:
            server = SDKServer("proctor-code-mode", instructions=instructions)
        else:  # 1.x chooses its Host/Origin check from the host it is made with
            server = SDKServer("proctor-code-mode", instructions=instructions, host=host)  # type: ignore[call-arg]
        code_mode = self

        async def run_python(code: str, ctx: Context) -> str:
            """Run a Python program in a governed sandbox where every upstream tool is a function.

            Variables persist across calls in this session. The result is the program's output, the
            value of its last expression, and a table of the tool calls it made with the policy's
            decision for each. A refused call raises at its call site (ToolDenied, ApprovalDenied,
            BudgetExceeded), so the program can catch it.

            Args:
                code: The Python program.
            """
            session = code_mode.session_or_ended(key_of(ctx), principal_of(ctx))
            if isinstance(session, str):
                return f"error: {session}"
            loop = asyncio.get_running_loop()  # the program's approvals are elicited on this request's channel
            return await loop.run_in_executor(None, code_mode.run_python, session, code, (loop, ctx),
                                              client_can_elicit(ctx))

        async def search_tools(query: str) -> str:
            """Find the functions run_python programs can call: Python signatures with a line each.

            Args:
                query: Words to look for in tool names and descriptions ('' lists the first ones).
            """
            return code_mode.search(query)

        async def describe_tool(name: str) -> str:
            """One function's full Python signature, docstring and how the policy treats it.

            Args:
                name: The function's name, as search_tools shows it.
            """
            return code_mode.describe(name)

        for fn in (run_python, search_tools, describe_tool):  # the docstring, dedented, is the description
            server.tool(description=inspect.cleandoc(fn.__doc__ or ""))(fn)
        return server


def client_can_elicit(ctx: Any) -> bool:
    """Whether the client of `ctx`'s session declared the elicitation capability."""
    session = ctx.session
    if MCP_MAJOR >= 2:
        caps = session.client_capabilities
    else:
        params = session.client_params
        caps = params.capabilities if params is not None else None
    if caps is None:
        return False
    data = caps.model_dump(by_alias=True, exclude_none=True) if isinstance(caps, pydantic.BaseModel) else {}
    return "elicitation" in data


def request_headers(ctx: Any) -> Mapping[str, str]:
    """The HTTP headers of `ctx`'s request ({} on stdio)."""
    request = ctx.request_context.request
    headers = getattr(request, "headers", None)
    return headers if isinstance(headers, Mapping) else {}


def render_result(result: Any) -> str:
    """What the client's model reads of one program: output, last value, calls, error."""
    parts: list[str] = []
    logs = str(result.logs or "")
    if logs:
        parts.append("output:\n" + (logs if len(logs) <= _LOG_CAP else logs[:_LOG_CAP] + "\n… (output cut)"))
    if result.value is not None:
        try:
            text = repr(result.value)
        except Exception as exc:  # noqa: BLE001 - a value whose repr fails is still reported
            text = f"<{type(result.value).__name__}: repr failed: {type(exc).__name__}>"
        parts.append("value: " + (text if len(text) <= _VALUE_CAP else text[:_VALUE_CAP] + "… (cut)"))
    calls = list(result.tool_calls)
    if calls:
        decisions = [c.decision.outcome if c.decision is not None else "-" for c in calls]
        listed = _listed_calls([(d, c.status) for d, c in zip(decisions, calls, strict=True)])
        rows = [("#", "tool", "decision", "status", "ms", "note")]
        for i in listed:
            c = calls[i]
            note = _first_line(c.error)[:160] if c.status != "ok" and c.error else (c.approval or "")
            rows.append((str(i + 1), c.tool, decisions[i], c.status, f"{c.duration_ns / 1e6:.0f}", note))
        widths = [max(len(r[k]) for r in rows) for k in range(5)]
        lines = ["  ".join(r[k].ljust(widths[k]) for k in range(5)) + ("  " + r[5] if r[5] else "") for r in rows]
        parts.append(f"calls ({len(calls)}):\n" + "\n".join(line.rstrip() for line in lines)
                     + _unlisted(calls, decisions, listed))
    if result.error is not None:  # a ProgramError's text starts with the program's own exception type
        kind = type(result.error).__name__
        parts.append(f"error: {result.error}" if kind == "ProgramError" else f"error: {kind}: {result.error}")
    if result.state_lost:
        parts.append("note: the sandbox was restarted; variables from earlier programs are gone")
    return "\n\n".join(parts) or "(no output, no value, no calls)"


def _listed_calls(ends: Sequence[tuple[str, str]]) -> list[int]:
    """The indexes of the calls the table lists (each call's (decision, status) given): all of them up to
    `_CALL_ROWS`; past that, the calls that did not simply run (refused, asked about, failed, unknown), then
    the first of the others, `_CALL_ROWS` in all. The audit trail has every call."""
    if len(ends) <= _CALL_ROWS:
        return list(range(len(ends)))
    notable = [i for i, (decision, status) in enumerate(ends) if decision != "allow" or status != "ok"]
    notable = notable[:_CALL_ROWS - _PLAIN_ROWS]
    chosen = set(notable)
    plain = [i for i in range(len(ends)) if i not in chosen][:_CALL_ROWS - len(notable)]
    return sorted(chosen | set(plain))


def _unlisted(calls: Sequence[Any], decisions: Sequence[str], listed: Sequence[int]) -> str:
    """The line that counts the calls the table left out, by tool, decision and status ('' when none)."""
    left = len(calls) - len(listed)
    if not left:
        return ""
    shown = set(listed)
    groups: dict[tuple[str, str, str], int] = {}
    for i, c in enumerate(calls):
        if i not in shown:
            key = (c.tool, decisions[i], c.status)
            groups[key] = groups.get(key, 0) + 1
    top = sorted(groups.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{n} {tool} {decision} {status}" for (tool, decision, status), n in top[:5])
    more = f", and {len(top) - 5} other kinds" if len(top) > 5 else ""
    return f"\n… {left} more calls not listed: {text}{more} (the audit trail has every call)"


def _summary(description: str) -> str:
    """A description's first line as search_tools shows it: at most `_SUMMARY_CAP` characters (the server
    wrote it; describe_tool shows it whole)."""
    line = _first_line(description)
    return line if len(line) <= _SUMMARY_CAP else line[:_SUMMARY_CAP] + "…"


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0]



def serve_stdio(code_mode: CodeMode) -> None:
    """Serve one MCP session on stdin/stdout (the client started this process); its principal is the
    configured user. The session, and its run, end when the client closes stdin."""
    server = code_mode.build_server(lambda ctx: code_mode.user, lambda ctx: "stdio")
    with _StdinEnds() as stdin:
        try:
            asyncio.run(server.run_stdio_async())
        except BaseException as exc:
            if not _client_gone(exc):
                code_mode.close("interrupted", error=f"interrupted by {interruption(exc)}")  # Ctrl-C, then the exit
                raise
            # The client closed its end while an answer was being written to it: it closed the connection, as
            # on EOF (where mcp 1.x, which drops the write, ends too), with the lost answer said.
            code_mode.close(reason="the client closed the connection before an answer could be sent to it (a "
                                   "program's result was not delivered)")
            return
    if stdin.signalled is None:
        code_mode.close()
        return
    code_mode.close("interrupted", error=f"interrupted by {signal.Signals(stdin.signalled).name}")
    raise Terminated(stdin.signalled)


def _client_gone(exc: BaseException) -> bool:
    """Whether `exc` (an exception group the SDK's task group raised, or one error) is only the client's pipe
    closing under a write: a broken pipe or a reset connection, and nothing else."""
    if isinstance(exc, _Group):
        return all(_client_gone(inner) for inner in exc.exceptions)
    return isinstance(exc, (BrokenPipeError, ConnectionResetError))


class _StdinEnds:
    """While inside, the SDK reads stdin through a pipe that ends (EOF) on SIGTERM or SIGHUP, so the
    session ends as if the client had closed it and its run is finished before the process exits.
    (Raising in the handler instead would wait for the SDK's stdin thread, which only a line or EOF
    wakes.) Only the pump thread writes to, and closes, the pipe: the handler wakes it through a
    second pipe, so no byte from the client can reach a descriptor number reused after a close.
    Signals are taken only where they are at their default."""

    signalled: int | None = None

    def __enter__(self) -> "_StdinEnds":
        self._stdin = sys.stdin
        self._read, self._write = os.pipe()
        self._wake_read, self._wake_write = os.pipe()
        self._handlers: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(signum) is signal.SIG_DFL:
                    self._handlers[signum] = signal.signal(signum, self._on_signal)
        source = self._stdin.buffer.fileno()
        self._pump_thread = threading.Thread(target=self._pump, args=(source,), name="proctor-mcp-stdin",
                                             daemon=True)
        self._pump_thread.start()
        sys.stdin = io.TextIOWrapper(os.fdopen(self._read, "rb"), encoding="utf-8")
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._handlers.items():
            signal.signal(signum, previous)
        self._wake()
        sys.stdin.close()  # a write the pump is blocked in fails (EPIPE): it ends
        sys.stdin = self._stdin
        self._pump_thread.join(5)
        if not self._pump_thread.is_alive():
            os.close(self._wake_read)
            os.close(self._wake_write)

    def _pump(self, source: int) -> None:
        try:
            while True:
                ready, _, _ = select.select([source, self._wake_read], [], [])
                if self._wake_read in ready:
                    break
                chunk = os.read(source, 65536)
                if not chunk:
                    break
                view = memoryview(chunk)
                while view:
                    view = view[os.write(self._write, view):]
        except OSError:  # stdin failed, or the SDK stopped reading: either way the session ends
            pass
        finally:
            os.close(self._write)

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.signalled is None:
            self.signalled = signum
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_write, b"x")
        except OSError:  # already woken often enough to fill the pipe
            pass


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``HOST:PORT`` for `serve_http` (as uvicorn binds one): `OSError` when it cannot be,
    before anything is started behind it."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def serve_http(code_mode: CodeMode, host: str, port: int, tokens: Any, *,
               listener: socket.socket | None = None, max_body: int = DEFAULT_MAX_BODY) -> None:
    """Serve streamable HTTP at ``http://HOST:PORT/mcp``; every request needs ``Authorization: Bearer
    TOKEN`` of `tokens` (a `proctor.approval.tokens.TokenFile`), whose owner is the session's principal. A
    request body is JSON of at most `max_body` bytes (`proctor.serve.guard.RequestGuard`: 413 past it, before
    more is read).
    `listener`: a socket `listen` bound (else uvicorn binds `host`:`port` itself). A session ends when its client
    deletes it (``DELETE /mcp``, once the SDK has), after `code_mode.session_idle`
    seconds with no request in flight (the client went away: ``run_finished`` says ``abandoned``), or when the
    server stops."""
    def principal_of(ctx: Any) -> str:
        who = tokens.who(_bearer(request_headers(ctx)) or "")
        if who is None:  # the middleware let nothing else through; checked again where it is used
            raise PermissionError("no valid bearer token")
        return str(who)

    def key_of(ctx: Any) -> str:
        sid = request_headers(ctx).get("mcp-session-id")
        return f"http:{sid}" if sid else f"http:request:{id(ctx.session)}"

    server = code_mode.build_server(principal_of, key_of, host)
    # The SDK forgets an idle session's transport after the same time as the reaper ends its run. It checks
    # Host and Origin (against DNS rebinding) by the address served on: bound to localhost, only localhost
    # names pass; bound beyond it, clients name the server as they reach it, and the bearer token is the check.
    if MCP_MAJOR >= 2:
        http_app = server.streamable_http_app(session_idle_timeout=code_mode.session_idle, host=host)
    else:
        server.settings.session_idle_timeout = code_mode.session_idle  # type: ignore[attr-defined]  # mcp 1.x
        http_app = server.streamable_http_app()
    app = RequestGuard(BearerAuth(http_app, tokens, code_mode), max_body=max_body, body_types=json_bodies)
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    stop = threading.Event()
    reaper = threading.Thread(target=_reap_until, args=(code_mode, stop), name="proctor-mcp-reaper", daemon=True)
    reaper.start()
    http = uvicorn.Server(config)
    # uvicorn stops gracefully on SIGINT/SIGTERM, then restores the handlers it found and raises the
    # signal again: with the default handler that would kill the process before the sessions' runs
    # are finished in the audit trail, so the handler it finds records the signal instead.
    stopped: list[int] = []
    previous: dict[signal.Signals, Any] = {}

    def hang_up(signum: int, frame: object) -> None:
        # uvicorn takes SIGINT and SIGTERM only: a SIGHUP at its default would kill the process with the
        # sessions' runs unfinished, so it stops the server as SIGTERM does (as `mcp serve` on stdio).
        stopped.append(signum)
        http.should_exit = True

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, frame: stopped.append(signum))
        if signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:  # taken only where at its default, as on stdio
            previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, hang_up)
    try:
        http.run(sockets=[listener] if listener is not None else None)
    except BaseException as exc:
        stop.set()
        reaper.join()
        code_mode.close("interrupted", error=f"interrupted by {interruption(exc)}")
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    stop.set()
    reaper.join()
    if not stopped:
        code_mode.close()
        return
    code_mode.close("interrupted", error=f"interrupted by {signal.Signals(stopped[0]).name}")
    raise Terminated(stopped[0])


def _reap_until(code_mode: CodeMode, stop: threading.Event) -> None:
    """End idle sessions until `stop` is set, checking ten times per idle period (at most every 5 s)."""
    if code_mode.session_idle is None:
        return
    interval = min(max(code_mode.session_idle / 10, 0.05), 5.0)
    while not stop.wait(interval):
        code_mode.reap_idle()


def _bearer(headers: Mapping[str, str]) -> str | None:
    value = headers.get("authorization") or headers.get("Authorization") or ""
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _claiming(send: Any, code_mode: CodeMode, principal: str, claimed: list[bool]) -> Any:
    """`send`, recording the session id the response opens as `principal`'s before the client can learn it (in
    the place `CodeMode.admit` reserved; `claimed[0]` is set once it is)."""
    async def claiming(message: dict[str, Any]) -> None:
        if message.get("type") == "http.response.start":
            for name, value in message.get("headers", []):
                if name.decode("latin-1").lower() == "mcp-session-id" and not claimed[0]:
                    code_mode.claim(f"http:{value.decode('latin-1')}", principal, admitted=True)
                    claimed[0] = True
        await send(message)

    return claiming


def _ending(send: Any, code_mode: CodeMode, key: str) -> Any:
    """`send` for a ``DELETE`` of session `key`: its run is finished once the SDK answers that it ended the
    session (a 2xx), before the client hears so; a DELETE the SDK refuses leaves the session, and its run, on."""
    async def ending(message: dict[str, Any]) -> None:
        if message.get("type") == "http.response.start" and 200 <= int(message.get("status", 0)) < 300:
            await asyncio.get_running_loop().run_in_executor(None, code_mode.end_session, key)
        await send(message)

    return ending


class BearerAuth:
    """ASGI middleware: 401 for a request to the MCP endpoint without a valid bearer token of the
    token file; a ``DELETE`` of a session ends its run once the SDK has closed it."""

    def __init__(self, app: Any, tokens: Any, code_mode: CodeMode) -> None:
        self.app, self.tokens, self.code_mode = app, tokens, code_mode

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        raw = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope.get("headers", [])]
        names = [k for k, _ in raw]
        if names.count("mcp-session-id") > 1 or names.count("authorization") > 1:
            # This check would read one copy and the SDK another: another principal's session could be driven.
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body",
                        "body": b'{"error": "one Authorization and at most one Mcp-Session-Id header, please"}'})
            return
        headers = dict(raw)
        token = _bearer(headers)
        if token is None or self.tokens.who(token) is None:
            body = b'{"error": "a valid bearer token is required (proctor serve token NAME --tokens FILE)"}'
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
            await send({"type": "http.response.body", "body": body})
            return
        sid = headers.get("mcp-session-id")
        owner = self.code_mode.owner(f"http:{sid}") if sid else None
        claimed = [False]
        if not sid:  # an initialize: the session it opens is this principal's from its first byte, if it has room
            principal = str(self.tokens.who(token))
            refused = self.code_mode.admit(principal)
            if refused is not None:
                # A JSON-RPC error in the body: MCP clients show its message (the SDK's raises it from initialize).
                said = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": refused}})
                await send({"type": "http.response.start", "status": 429,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": said.encode()})
                return
            send = _claiming(send, self.code_mode, principal, claimed)
        if owner is not None and owner != self.tokens.who(token):  # another principal's session
            await send({"type": "http.response.start", "status": 403,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"error": "this MCP session is not yours"}'})
            return
        if scope.get("method") == "DELETE" and sid:  # the run ends before the client hears the session did
            send = _ending(send, self.code_mode, f"http:{sid}")
        if not sid:
            try:
                await self.app(scope, receive, send)
            finally:
                if not claimed[0]:  # no session came of it: its place is free again
                    self.code_mode.not_opened(principal)
            return
        self.code_mode.request_began(f"http:{sid}")
        try:
            await self.app(scope, receive, send)
        finally:
            self.code_mode.request_ended(f"http:{sid}")
