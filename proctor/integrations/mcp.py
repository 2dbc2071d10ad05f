"""MCP servers' tools as proctor tools (extra ``proctor[mcp]``, the official ``mcp`` SDK, 1.x or 2.x).

```python
from mcp import StdioServerParameters
from proctor.integrations.mcp import MCPToolset

with MCPToolset(StdioServerParameters(command="npx", args=["-y", "@modelcontextprotocol/server-memory"]),
                prefix="mem_") as tools:
    agent = CodeAgent(tools=tools, model=…, policy="policy.yaml")
    agent.run("…")
with MCPToolset("http://127.0.0.1:8000/mcp", headers={"Authorization": "Bearer …"}) as tools:
    …
```

An MCP server is not trusted, whoever runs it:

- **Annotations are hints.** Every MCP tool is ``destructive`` (the class proctor gives the
  undeclared) unless the policy's ``tools:`` section says otherwise, or the toolset is built with
  ``trust_annotations=True``, which trusts *that server's* annotations: ``readOnlyHint`` → read,
  else ``destructiveHint`` (which MCP defaults to true) → destructive, else ``openWorldHint`` (true
  by default) → external, else write.
- **Names cannot take over the program.** A tool whose Python name would be a builtin (``print``,
  ``open``, ``len``…, and proctor's errors a program catches: ``ToolDenied``…), a keyword, a
  dunder, ``final_answer``, one of `reserved` (other tools, agents) or another tool of the same
  server is refused when the toolset opens, naming the ``prefix=`` fix.
- **Listing is bounded**: at most `max_tools` tools over `max_pages` pages of ``tools/list``, each
  tool's definition at most `max_schema_bytes` and nested at most `max_schema_depth` levels, all
  within `timeout`; past any of them the listing stops and the toolset refuses to open, naming the
  limit (and, for the depth, where in the definition). A message the SDK cannot read while the
  tools are listed (JSON nested deeper than it parses, or no JSON-RPC at all) stops the listing
  at once, saying so, rather than at the timeout. Every message is bounded by `max_message_bytes`
  as it comes in — a stdio server's line (`proctor.integrations._mcp_stdio`), an HTTP server's
  answer or SSE event (`proctor.integrations._mcp_http`): past it the session is closed (a stdio
  server stopped), saying why.
- **A tool whose schema cannot be used is not offered.** A ``$ref`` in its ``inputSchema`` that
  does not resolve within the schema (a missing ``#/$defs/x``, or anything outside it), or one that
  leads back to itself without end, or an invalid ``inputSchema``, would refuse every call; in its
  ``outputSchema`` (or an invalid ``outputSchema``), every result, after the call ran: such a tool
  is left out of `tools` when the toolset opens, with why in `withheld` and in one warning log line;
  the server's other tools are offered as usual.
- **Patterns are checked in bounded time.** An ``inputSchema``'s regular expressions are checked
  within `proctor.jsoninput.PATTERN_TIMEOUT_S` per value (one that backtracks without end refuses
  the argument); a tool whose patterns could not be (``unevaluatedProperties`` beside
  ``patternProperties``, or any in its ``outputSchema``, which the SDK checks with `re`) is not offered.
- **What a server writes is shown escaped.** Control characters (ANSI escapes, C0/C1 controls,
  bidi overrides and isolates, invisible characters) in descriptions, titles, enum values and the
  error texts it returns become visible escapes (`proctor.termsafe.terminal_safe`) before any model
  or terminal sees them; newlines and tabs in a description are kept.
- **A call whose outcome is unknown says so.** A call that times out (the toolset's `timeout` or the
  policy's ``timeout`` for the tool, whichever is shorter) or whose server dies under it raises
  `ToolOutcomeUnknown`, naming the server and what happened; a ``notifications/cancelled`` is sent
  to the server for a call that timed out. So does a call answered with something that is no result
  (or structured content the tool's own output schema refuses); the session goes on.
- Every tool carries its server in `Tool.origin` (``mcp:<name>``), and so do its errors.

Each MCP tool's ``inputSchema`` is the schema its calls are validated against (a call that does
not fit is refused before anything runs; a ``$ref`` beyond the schema is never fetched, and a call
needing one is refused); models see the Python signature `proctor.signatures`
renders from it and from the ``outputSchema`` (nested ``TypedDict``s, nullability, defaults,
return type). A name that is not a Python identifier (``get-time``) is called as ``get_time``.

The SDK is asynchronous; the toolset's session lives on an event loop of its own, which the thread
making a call runs itself for the length of the call (no hand-off to another thread and back) and
the toolset's own thread runs the rest of the time. Tools are called from synchronous code (the
gate, the interpreter) and from async code alike.
"""

from __future__ import annotations

import asyncio
import builtins
import codecs
import contextvars
import dataclasses
import inspect
import json
import keyword
import os
import re
import sys
import threading
import time
from collections.abc import Awaitable, Coroutine, Iterable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version
from typing import TYPE_CHECKING, Any, TypeVar

import jsonschema
import pydantic
import referencing.exceptions

from proctor import errors as proctor_errors
from proctor.adapters import side_effect_of
from proctor.calls import SideEffect
from proctor.errors import ConfigurationError, MCPToolFailed, ToolOutcomeUnknown, ToolsetError
from proctor.jsoninput import (
    local_schema_validator,
    reference_cycle,
    regex_keywords,
    shape_problem,
    unbounded_pattern_use,
    unresolved_reference,
)
from proctor.signatures import Signature, TypeText, render_signature
from proctor.telemetry.logging import get_logger
from proctor.termsafe import is_invisible, terminal_safe, text_safe
from proctor.tools import Tool

#: The ``mcp`` SDK releases this module is tested with (CI runs the newest 1.x and the newest 2.x).
SUPPORTED_MCP = ">=1.30,<3"


def _mcp_major() -> int:
    try:
        text = _dist_version("mcp")
    except PackageNotFoundError:
        raise ImportError("proctor.integrations.mcp needs the mcp SDK: pip install 'proctor[mcp]'") from None
    parts = [int(p) for p in re.findall(r"\d+", text)[:2]] + [0, 0]
    if not (1, 30) <= (parts[0], parts[1]) < (3, 0):
        raise ImportError(f"proctor.integrations.mcp supports the mcp SDK {SUPPORTED_MCP} (1.30 and later 1.x, "
                          f"and 2.x); mcp {text} is installed: pip install 'mcp{SUPPORTED_MCP}'")
    return parts[0]


MCP_MAJOR = _mcp_major()

from mcp import ClientSession, StdioServerParameters  # noqa: E402 - after the version check, which names the fix
from mcp import types as mcp_types  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402 - the SDK's own client factory

from proctor.integrations._mcp_http import Cuttable, bound_responses  # noqa: E402 - they import the SDK too
from proctor.integrations._mcp_stdio import BoundedStdio  # noqa: E402

if TYPE_CHECKING or MCP_MAJOR >= 2:
    from mcp.shared.exceptions import MCPError as SDKError
else:  # 1.x spells it McpError
    from mcp.shared.exceptions import McpError as SDKError

__all__ = ["MCPTool", "MCPToolFailed", "MCPToolset", "SUPPORTED_MCP", "side_effect_of"]

_T = TypeVar("_T")
log = get_logger("proctor.mcp")
#: JSON-RPC's "connection closed" (the SDK's code when the server went away mid-request).
_CONNECTION_CLOSED = -32000
_TEXT_CAP = 2000
# proctor's errors are builtins of a program's sandbox too (`except ToolDenied:` must stay the error).
_RESERVED = frozenset(dir(builtins)) | {"final_answer"} | {
    name for name, value in vars(proctor_errors).items()
    if isinstance(value, type) and issubclass(value, BaseException)}


@dataclass(frozen=True, eq=False)
class MCPTool(Tool):
    """A tool of an MCP server: `run` calls the server through its `MCPToolset`, within the shorter
    of the toolset's timeout and the policy's for the tool."""

    toolset: MCPToolset | None = field(repr=False, default=None)
    #: The tool's name on its server (``get-stats``), which `name` may spell differently (``get_stats``).
    remote_name: str = ""
    #: The rendered signature (`proctor.signatures`): what ``describe_tool`` shows.
    rendered: Signature | None = field(repr=False, default=None)
    #: The optional parameters whose None means "not given": left out of the call (see `_sent_args`).
    optional_nulls: frozenset[str] = field(repr=False, default=frozenset())

    def run(self, args: Mapping[str, Any], timeout_s: float | None = None) -> Any:
        if self.toolset is None:
            raise ToolsetError(f"MCP tool {self.name!r} has no toolset")
        return self.toolset.call(self, args, timeout_s)


class MCPToolset:
    """A context manager connected to one MCP server, yielding its tools as proctor `Tool`s.

    `server` is ``mcp.StdioServerParameters`` (a server started as a subprocess) or the URL of a
    streamable HTTP endpoint (``http://host:port/mcp``, with `headers`). `timeout` bounds starting and
    listing, and each call unless `call_timeout` is given (seconds). `prefix` is put before every
    tool's name (``fs_`` → ``fs_read``). `name` names the server in records and errors (default: the
    command or URL). See the module's docstring for `trust_annotations`, `reserved` and the listing limits.
    Once open, `tools` are the tools offered and `withheld` names each listed tool that is not (by the
    Python name it would have had) with why.
    """

    def __init__(self, server: StdioServerParameters | str, *, timeout: float = 30, prefix: str = "",
                 headers: Mapping[str, str] | None = None, name: str | None = None,
                 trust_annotations: bool = False, reserved: Iterable[str] = (), max_tools: int = 256,
                 max_pages: int = 32, max_schema_bytes: int = 64 * 1024, max_schema_depth: int = 64,
                 max_message_bytes: int = 16 * 1024 * 1024, call_timeout: float | None = None) -> None:
        if not isinstance(server, (StdioServerParameters, str)):
            raise ConfigurationError(f"MCPToolset takes mcp.StdioServerParameters or an http(s) URL, "
                                     f"not a {type(server).__name__}")
        if isinstance(server, str) and not re.match(r"^https?://", server):
            raise ConfigurationError(f"an MCP server URL must start with http:// or https://, got {server!r}")
        if timeout <= 0 or (call_timeout is not None and call_timeout <= 0):
            raise ConfigurationError("timeout and call_timeout must be positive seconds")
        if prefix and not prefix.isidentifier():
            raise ConfigurationError(f"prefix {prefix!r} must start a Python identifier (letters, digits, _)")
        for label, limit in (("max_tools", max_tools), ("max_pages", max_pages),
                             ("max_schema_bytes", max_schema_bytes), ("max_schema_depth", max_schema_depth),
                             ("max_message_bytes", max_message_bytes)):
            if not isinstance(limit, int) or limit < 1:
                raise ConfigurationError(f"{label} must be a positive integer, got {limit!r}")
        self.server, self.timeout, self.prefix = server, float(timeout), prefix
        self.call_timeout = float(call_timeout) if call_timeout is not None else self.timeout
        self.headers = dict(headers or {})
        self.trust_annotations = bool(trust_annotations)
        self.reserved = frozenset(reserved)
        self.max_tools, self.max_pages, self.max_schema_bytes = max_tools, max_pages, max_schema_bytes
        self.max_schema_depth, self.max_message_bytes = max_schema_depth, max_message_bytes
        #: The stdio transport of the session (None over HTTP): it says why, when it closed the session itself.
        self._stdio: BoundedStdio | None = None
        #: Over HTTP, the read stream the session reads, and why it was cut (an answer past `max_message_bytes`).
        self._relay: Cuttable | None = None
        self._cut: str | None = None
        self.name = name or self._label()
        self.origin = f"mcp:{self.name}"
        self.tools: list[Tool] = []
        #: The listed tools not offered, by the Python name each would have had: why (escaped, one line).
        self.withheld: dict[str, str] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._driven: _DrivenLoop | None = None
        self._main_task: asyncio.Task[None] | None = None
        self._session: ClientSession | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready: Future[list[dict[str, Any]]] = Future()
        self._ended: str | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> list[Tool]:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> list[Tool]:
        """Start (or connect to) the server and list its tools; raise `ToolsetError` if that fails."""
        if self._thread is not None:
            return self.tools
        driven = self._driven = _DrivenLoop()
        self._loop = driven.loop
        self._thread = threading.Thread(target=self._run, args=(driven,), name="proctor-mcp", daemon=True)
        self._thread.start()
        try:
            # The listing stops itself at `timeout` (inside the loop); the margin only covers a loop
            # that cannot even get there.
            listed = self._ready.result(self.timeout + 5)
        except FutureTimeout:
            self.close()
            raise ToolsetError(f"the MCP server {self.name} did not answer within {self.timeout:g}s") from None
        except ToolsetError:
            self.close()
            raise
        try:
            self.tools = self._tools(listed)
        except ToolsetError:
            self.close()
            raise
        driven.set_hold(False)  # listed: from now on a call runs the loop in its own thread
        return self.tools

    def close(self) -> None:
        """End the session (and stop a stdio server)."""
        loop, stop, thread, task = self._loop, self._stop, self._thread, self._main_task
        if loop is not None and not loop.is_closed():
            try:
                if stop is not None:
                    loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop already stopped
                pass
        if self._driven is not None:  # the toolset's thread runs the loop through the teardown
            self._driven.set_hold(True)
        if thread is not None:
            thread.join(self.timeout)
            if thread.is_alive() and loop is not None and task is not None and not loop.is_closed():
                try:  # it did not end when asked: stop it where it is
                    loop.call_soon_threadsafe(task.cancel)
                except RuntimeError:
                    pass
                thread.join(self.timeout)
        self._thread = None

    def _label(self) -> str:
        if isinstance(self.server, str):
            return self.server
        return " ".join([self.server.command, *self.server.args])

    def smolagents_tools(self, gate: Any) -> list[Any]:
        """The tools as smolagents tools for ``smolagents.CodeAgent(tools=…)``, each call going through
        `gate` (``proctor.integrations.smolagents.govern_tools``): a smolagents agent never gets an
        MCP tool it could call ungoverned."""
        from proctor.integrations.smolagents import govern_tools

        return list(govern_tools(self.tools, gate))

    # -- the session, on its own event loop ------------------------------------------------------

    def _run(self, driven: _DrivenLoop) -> None:
        try:
            driven.serve(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported to open(), which raises it
            inner = _innermost(exc)
            if not self._ready.done():
                self._ready.set_exception(inner if isinstance(inner, ToolsetError) else ToolsetError(
                    f"the MCP server {self.name} failed: {terminal_safe(self._closed_because() or _reason(exc))}"))
        finally:
            self._ended = self._ended or "the session ended"
            if not self._ready.done():
                self._ready.set_exception(ToolsetError(f"the MCP server {self.name} ended before listing its tools"))

    async def _main(self) -> None:
        self._main_task = asyncio.current_task()
        self._stop = asyncio.Event()
        try:
            if isinstance(self.server, str):
                http = create_mcp_http_client(headers=self.headers)
                bound_responses(http, limit=self.max_message_bytes, cut=self._cut_off)
                sized: dict[str, Any] = {"max_sse_event_size": self.max_message_bytes} if MCP_MAJOR >= 2 else {}
                async with http, streamable_http_client(self.server, http_client=http, **sized) as streams:
                    read = self._relay = Cuttable(streams[0])
                    relay = asyncio.ensure_future(read.pump())
                    try:
                        await self._serve(read, streams[1])
                    finally:
                        relay.cancel()
                        await asyncio.gather(relay, return_exceptions=True)
            else:
                stderr = _EscapedStderr()
                self._stdio = BoundedStdio(self.server, max_line=self.max_message_bytes, errlog=stderr.writer)
                try:
                    async with self._stdio.connect() as streams:
                        await self._serve(streams[0], streams[1])
                finally:
                    stderr.close()
        finally:
            self._session = None

    async def _serve(self, read: Any, write: Any) -> None:
        if MCP_MAJOR == 1:  # 1.x sends no cancellation of its own: note request ids to send one
            write = _NoteRequestIds(write)
        # A line the SDK cannot parse (JSON nested deeper than it reads, or no JSON-RPC) is handed to the session's
        # message handler, and the request it answered waits for ever: while listing, it stops the listing now.
        unreadable: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def on_message(message: object) -> None:
            if isinstance(message, Exception) and not unreadable.done():
                unreadable.set_result(_unreadable(message))

        async with ClientSession(read, write, message_handler=on_message) as session:
            listed = await self._list_watched(session, unreadable)
            self._session = session
            self._ready.set_result(listed)
            assert self._stop is not None
            await self._stop.wait()
            self._ended = "the toolset was closed"

    async def _list_watched(self, session: ClientSession, unreadable: asyncio.Future[str]) -> list[dict[str, Any]]:
        """`_list` within `timeout`, stopped as soon as the server sends a message that cannot be read."""
        listing = asyncio.ensure_future(self._list(session))
        either: set[asyncio.Future[Any]] = {listing, unreadable}
        try:
            await asyncio.wait(either, timeout=self.timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not listing.done():
                listing.cancel()
                await asyncio.gather(listing, return_exceptions=True)
        if not listing.cancelled():
            return listing.result()  # listed (or why not), even if something unreadable came after
        if unreadable.done():
            why = unreadable.result()
            hint = " (nested too deeply for the MCP SDK to parse: flatten the server's schemas)" \
                if "recursion limit" in why else ""
            raise ToolsetError(f"the MCP server {self.name} sent a message that cannot be read while its tools were "
                               f"listed: {why}{hint}; the listing was stopped")
        raise ToolsetError(f"the MCP server {self.name} did not list its tools within {self.timeout:g}s "
                           "(the listing was stopped; raise `timeout=` if it is just slow)")

    async def _list(self, session: ClientSession) -> list[dict[str, Any]]:
        await session.initialize()
        listed: list[dict[str, Any]] = []
        cursor: str | None = None
        for _page in range(self.max_pages):
            params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = _wire(await session.list_tools(params=params))
            tools = page.get("tools")
            for spec in tools if isinstance(tools, list) else []:
                if len(listed) >= self.max_tools:
                    raise ToolsetError(f"the MCP server {self.name} lists more than {self.max_tools} tools "
                                       f"(max_tools={self.max_tools}): the listing was stopped")
                what = f"the MCP server {self.name}: tool {str(spec.get('name'))[:80]!r}'s definition"
                try:
                    text = json.dumps(spec, separators=(",", ":"))
                except RecursionError:  # deeper than the SDK's own parser goes today: refused all the same
                    raise ToolsetError(f"{what} is nested deeper than max_schema_depth={self.max_schema_depth} "
                                       "levels: the listing was stopped") from None
                if len(text) > self.max_schema_bytes:
                    raise ToolsetError(f"{what} is {len(text)} bytes, over max_schema_bytes={self.max_schema_bytes}")
                # Validating against a schema, and rendering it, recurse once a level: bounded before either runs.
                problem = shape_problem(text, what, max_depth=self.max_schema_depth, max_bytes=self.max_schema_bytes)
                if problem is not None:
                    raise ToolsetError(f"{problem} (max_schema_depth={self.max_schema_depth}): the listing was stopped")
                listed.append(spec)
            next_cursor = page.get("nextCursor")
            if not next_cursor:
                return listed
            cursor = str(next_cursor)
        raise ToolsetError(f"the MCP server {self.name} pages tools/list past {self.max_pages} pages "
                           f"(max_pages={self.max_pages}): the listing was stopped")

    # -- calls -----------------------------------------------------------------------------------

    def call(self, tool: MCPTool, args: Mapping[str, Any], timeout_s: float | None = None) -> Any:
        """Call `tool` on the server with validated `args`; the result, or an error saying what happened."""
        loop, session = self._loop, self._session
        where = f"{tool.name} (MCP server {self.name})"
        if loop is None or session is None or loop.is_closed():
            raise ToolsetError(f"{where}: the MCP session is closed ({self._ended or 'not opened'}): {self._hint()}")
        limit = self.call_timeout if timeout_s is None else min(self.call_timeout, timeout_s)
        sent = _sent_args(tool, args)
        assert self._driven is not None  # set with the loop
        try:  # the coroutine ends itself at `limit`; `limit + 10` is a backstop
            return self._driven.call(self._call(session, tool, sent, limit), limit + 10)
        except ToolsetError:
            raise ToolsetError(f"{where}: the MCP session is closed ({self._ended or 'the session ended'}): "
                               f"{self._hint()}") from None
        except FutureTimeout:
            raise ToolOutcomeUnknown(f"{where}: no answer within {limit:g}s and the session did not end the call; "
                                     "it may have taken effect", tool=tool.name,
                                     error_type="ToolOutcomeUnknown") from None

    async def _call(self, session: ClientSession, tool: MCPTool, args: dict[str, Any], limit: float) -> Any:
        where = f"{tool.name} (MCP server {self.name})"
        ids: list[Any] = []
        _SENT.set(ids)
        try:
            result = await _within(session.call_tool(tool.remote_name, args), limit)
        except asyncio.TimeoutError:
            await self._cancel(session, ids, f"timed out after {limit:g}s")
            raise ToolOutcomeUnknown(f"{where}: timed out after {limit:g}s; a cancellation was sent to the server, "
                                     "and the call may have taken effect", tool=tool.name,
                                     error_type="ToolOutcomeUnknown") from None
        except SDKError as exc:
            code, message = exc.error.code, terminal_safe(str(exc.error.message)[:_TEXT_CAP])
            if code != _CONNECTION_CLOSED:  # the server answered: an error response, nothing unknown
                raise MCPToolFailed(f"{where}: the server refused the call: {message or f'error {code}'}",
                                    tool=tool.name, error_type="MCPError") from None
            raise self._lost(tool, message) from None
        except (pydantic.ValidationError, RuntimeError) as exc:
            # The server answered, but not with a result (the SDK's parse failed), or with structured content its
            # own output schema refuses (the SDK's check): the call may have run, and the connection is intact.
            raise ToolOutcomeUnknown(f"{where}: the server's answer is not a result proctor can read "
                                     f"({terminal_safe(_clip(_first_line(_reason(exc)), 300))}); the call may have "
                                     "taken effect",
                                     tool=tool.name, error_type="ToolOutcomeUnknown") from None
        except (asyncio.CancelledError, Exception) as exc:  # noqa: BLE001 - the session broke under the call
            raise self._lost(tool, _reason(exc)) from None
        return _result_value(where, tool, _wire(result))

    def _hint(self) -> str:
        """What to do about a closed session: a toolset used outside its `with`, or a server that went away (whose
        session is not opened again by itself: a new toolset, or a restarted `proctor mcp serve`, reaches it)."""
        if self._ended is None or self._ended == "the toolset was closed":
            return "use the tools inside `with`"
        return (f"the MCP server {self.name} is not reached again by this toolset: open a new one (for `proctor mcp "
                "serve`, restart it) once the server runs")

    def _closed_because(self) -> str | None:
        """Why the transport closed the session itself (a line or answer past `max_message_bytes`), if it did."""
        return self._stdio.ended if self._stdio is not None else self._cut

    def _cut_off(self, why: str) -> None:
        """An HTTP answer could not be read within `max_message_bytes` (past it, or compressed): end the session's
        read stream, saying why."""
        if self._cut is None:
            self._cut = why
            log.warning("mcp_session_cut", server=terminal_safe(self.name), reason=why)
        if self._relay is not None:
            self._relay.cut()

    def _lost(self, tool: MCPTool, why: str) -> ToolOutcomeUnknown:
        # Nothing more goes to a session that broke: later calls are refused before they are sent.
        self._session, self._ended = None, f"the connection was lost during a call to {tool.name}"
        closed = self._closed_because()
        if closed is not None:
            return ToolOutcomeUnknown(f"{tool.name} (MCP server {self.name}): {closed}; the call may have taken effect",
                                      tool=tool.name, error_type="ToolOutcomeUnknown")
        return ToolOutcomeUnknown(f"{tool.name} (MCP server {self.name}): the connection to the server was lost "
                                  f"during the call ({terminal_safe(why) or 'no reason given'}); it may have taken "
                                  "effect",
                                  tool=tool.name, error_type="ToolOutcomeUnknown")

    async def _cancel(self, session: ClientSession, ids: list[Any], reason: str) -> None:
        """Tell the server to stop the request (2.x sends this itself when the call is abandoned)."""
        if MCP_MAJOR >= 2 or not ids:
            return
        types_v1: Any = mcp_types  # 1.x's typed notification (2.x, which mypy reads, builds it itself)
        note = types_v1.ClientNotification(types_v1.CancelledNotification(
            method="notifications/cancelled", params=types_v1.CancelledNotificationParams(requestId=ids[-1],
                                                                                          reason=reason)))
        try:
            await asyncio.wait_for(session.send_notification(note), 5)
        except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - the call is reported unknown either way
            pass

    # -- tools -----------------------------------------------------------------------------------

    def _tools(self, listed: list[dict[str, Any]]) -> list[Tool]:
        tools: list[Tool] = []
        taken: dict[str, str] = {}
        for spec in listed:
            remote = spec.get("name")
            if not isinstance(remote, str) or not remote:
                raise ToolsetError(f"the MCP server {self.name} lists a tool without a name")
            name = self.prefix + re.sub(r"\W", "_", remote, flags=re.ASCII)
            if not name.isidentifier():
                name = "mcp_" + name
            problem = None
            if keyword.iskeyword(name) or keyword.issoftkeyword(name):
                problem = "is a Python keyword"
            elif name in _RESERVED or (name.startswith("__") and name.endswith("__")):
                problem = "is a Python builtin"
            elif name in self.reserved:
                problem = "is already taken by another tool or agent"
            elif name in taken:
                problem = f"is also the name of its tool {taken[name]!r}"
            if problem is not None:
                raise ToolsetError(f"the MCP server {self.name}: tool {remote[:80]!r} would be called {name!r}, which "
                                   f"{problem}; give the server's tools a prefix: MCPToolset(..., prefix='"
                                   f"{_suggest_prefix(self.name)}')")
            taken[name] = remote
            made = self._tool(name, remote, spec)
            if isinstance(made, str):
                self.withheld[name] = made
                log.warning(terminal_safe(f"MCP server {self.name}: tool {remote[:80]!r} ({name}) is not offered: "
                                          f"{made}"))
                continue
            tools.append(made)
        return tools

    def _tool(self, name: str, remote: str, spec: Mapping[str, Any]) -> MCPTool | str:
        """The tool `remote` as `name`, or why it cannot be offered."""
        raw = spec.get("inputSchema")
        schema: dict[str, Any] = dict(raw) if isinstance(raw, Mapping) else {"type": "object"}
        schema.setdefault("type", "object")
        output = spec.get("outputSchema")
        output_schema = dict(output) if isinstance(output, Mapping) else None
        # Broken, an inputSchema would refuse every call; an outputSchema (the SDK checks each result against it) every
        # result, after the call ran: such a tool is not offered at all, saying why.
        checker, why = _checked_schema("inputSchema", schema)
        if why is None and output_schema is not None:
            why = _checked_schema("outputSchema", output_schema)[1]
        if why is not None:
            return why
        rendered = render_signature(name, schema, output_schema)
        props: Mapping[str, Any] = schema.get("properties") or {}
        fields: dict[str, Any] = {}
        params: list[inspect.Parameter] = []
        docs: dict[str, str] = {}
        for arg in props:
            # An invisible character (U+3164 is a letter to Python) would let two names read alike.
            if not isinstance(arg, str) or not arg.isidentifier() or keyword.iskeyword(arg) \
                    or arg.startswith("_proctor_") or any(is_invisible(c) for c in arg):
                shown = terminal_safe(str(arg)[:80])
                raise ToolsetError(f"the MCP server {self.name}: tool {remote!r}: argument {shown!r} cannot be a "
                                   "Python parameter")
        for p in rendered.params:
            docs[p.name] = p.description
            default: Any = inspect.Parameter.empty if p.required else p.default_value
            # Types are checked against the full JSON Schema (`check`); pydantic only binds and refuses extras.
            fields[p.name] = (Any, pydantic.Field(... if p.required else default, description=p.description))
            params.append(inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                                            annotation=_annotation(p.annotation)))
        returns: Any = _annotation(rendered.returns) if rendered.returns else inspect.Signature.empty
        # The server's words reach models and terminals: escaped (newlines and tabs kept), as the signature is.
        said = spec.get("description") or spec.get("title") or f"MCP tool {remote}"
        description = text_safe(_clip(str(said).strip()))
        if rendered.types:  # the model needs the TypedDicts the signature names
            description += "\n\nTypes:\n" + "\n\n".join(rendered.types.values())
        hints = spec.get("annotations")
        side_effect: SideEffect = side_effect_of(hints if isinstance(hints, Mapping) else None) \
            if self.trust_annotations else "destructive"
        optional_nulls = frozenset(p.name for p in rendered.params if not p.required and p.default_value is None)

        def check(args: Mapping[str, Any]) -> str | None:
            sent = {k: v for k, v in args.items() if not (k in optional_nulls and v is None)}
            try:
                errors = sorted(checker.iter_errors(sent), key=lambda e: list(e.path))
            except referencing.exceptions.Unresolvable as exc:
                return f"the tool's inputSchema refers to {terminal_safe(str(exc.ref)[:300])!r}, outside itself " \
                       "(proctor resolves no reference a server points it at)"
            if not errors:
                return None
            # The messages quote the server's schema (its enum values, patterns): escaped like all it wrote.
            return terminal_safe("; ".join(f"argument {'.'.join(str(p) for p in e.path) or 'arguments'!r}: "
                                           f"{e.message[:300]}" for e in errors[:5]))

        def unbound(**kwargs: Any) -> Any:
            raise ToolsetError(f"MCP tool {name!r} runs through its toolset, not as a function")

        unbound.__name__ = name
        unbound.__doc__ = description
        base = Tool.from_fields(name, description, unbound, fields,
                                inspect.Signature(params, return_annotation=returns), docs, side_effect=side_effect,
                                cost=0, source=dict(spec), schema=schema, check=check,
                                output_type=_output_type(output_schema, rendered))
        values = {f.name: getattr(base, f.name) for f in dataclasses.fields(Tool)}
        values.update(origin=self.origin)
        return MCPTool(**values, toolset=self, remote_name=remote, rendered=rendered, optional_nulls=optional_nulls)


#: How long the loop may go unrun after a caller ran it before the toolset's thread runs it again
#: (seconds): a program's next call comes well within it and runs the loop itself, hand-off free.
_IDLE_S = 0.02
_OWN = -1  # `_DrivenLoop._driver` while the toolset's own thread runs the loop


class _DrivenLoop:
    """The toolset's event loop, run by the thread that needs it: a thread making a call runs the loop
    itself for the length of the call, and the toolset's own thread runs it the rest of the time.

    Why: a call handed to a loop that another thread runs costs two wake-ups of a sleeping thread (the
    loop's, to start the call; the caller's, to take its result), each a scheduler hand-off and a turn
    of the GIL. Driven by the caller, the loop wakes the caller itself when the server answers, as an
    MCP client on its own loop is woken.

    At most one thread runs the loop at a time (`_driver`). A caller takes it when nobody runs it, or
    asks the toolset's thread to end its turn and waits for it; while another caller runs it, the call
    is handed to that caller's running loop instead, so two calls at once to one server stay concurrent.
    The toolset's thread runs the loop whenever a handed call is in flight, while held (`set_hold`:
    starting, listing, closing), and once no caller has run it for `_IDLE_S` (so between programs the
    session answers the server's pings and notifications, and notices a server that went away).
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.finished = False
        self._hold = True
        self._cv = threading.Condition()
        self._driver: int | None = None
        self._waiting = 0  # callers waiting to run the loop
        self._handed = 0  # calls handed to the loop while another thread runs it, not yet ended
        self._released = time.monotonic()  # when a caller last stopped running the loop
        self._turn: asyncio.Future[None] | None = None  # resolved to end the toolset thread's turn
        self._asked = False  # whether the current turn's end was asked for
        self._main: asyncio.Task[None] | None = None

    # -- the toolset's thread ----------------------------------------------------------------------

    def serve(self, main: Coroutine[Any, Any, None]) -> None:
        """Run `main` (the session) to its end, running the loop whenever no caller does; then close the
        loop. Raises what `main` raised."""
        loop = self.loop
        task = self._main = loop.create_task(main)
        task.add_done_callback(self._end_turn)
        try:
            while self._take_turn(task):
                turn = self._turn
                assert turn is not None
                try:
                    loop.run_until_complete(turn)
                finally:
                    with self._cv:
                        self._driver = self._turn = None
                        self._cv.notify_all()
        finally:
            try:
                _cancel_all(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                with self._cv:
                    self.finished = True
                    self._cv.notify_all()
                loop.close()
        if task.cancelled():
            raise asyncio.CancelledError
        error = task.exception()
        if error is not None:
            raise error

    def _take_turn(self, task: asyncio.Task[None]) -> bool:
        """Wait until the toolset's thread should run the loop and make it the driver; False once the
        session has ended and no caller runs the loop (it is then the driver for good: the teardown)."""
        with self._cv:
            while True:
                if task.done() and self._driver is None:
                    self._driver = _OWN
                    return False
                wait = self._wait_s(task)
                if wait == 0:
                    self._driver, self._asked = _OWN, False
                    self._turn = self.loop.create_future()
                    return True
                self._cv.wait(wait)

    def _wait_s(self, task: asyncio.Task[None]) -> float:
        """0 when the toolset's thread should run the loop now, else how long to wait before looking again."""
        if self._waiting or self._driver is not None:
            return _IDLE_S  # a caller runs it (or is about to); look again then: its release tells only when it must
        if self._hold or self._handed or task.done():
            return 0
        idle = time.monotonic() - self._released
        return 0 if idle >= _IDLE_S else _IDLE_S - idle

    def _end_turn(self, _: object = None) -> None:
        turn = self._turn
        if turn is not None and not turn.done():
            turn.set_result(None)

    def set_hold(self, hold: bool) -> None:
        """Whether the toolset's thread runs the loop whenever no caller does (starting, listing, closing)."""
        with self._cv:
            self._hold = hold
            self._cv.notify_all()

    # -- callers -----------------------------------------------------------------------------------

    def call(self, coro: Coroutine[Any, Any, Any], backstop_s: float) -> Any:
        """Run `coro` on the loop and return its result; `FutureTimeout` when it has not ended within
        `backstop_s` (it is then cancelled), `ToolsetError` when the loop has stopped."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:  # this thread runs a loop of its own, and cannot run a second one: hand the call over
            return self._hand(coro, backstop_s)
        me = threading.get_ident()
        with self._cv:
            self._waiting += 1
            try:
                while self._driver is not None and not self.finished:
                    if self._driver != _OWN:
                        break  # another caller runs the loop: it runs this call too
                    if self._turn is not None and not self._asked:
                        self._asked = True
                        self.loop.call_soon_threadsafe(self._end_turn)
                    self._cv.wait()
                if self.finished:
                    coro.close()
                    raise ToolsetError("the event loop has stopped")
                drive = self._driver is None
                if drive:
                    self._driver = me
            finally:
                self._waiting -= 1
        return self._drive(coro, backstop_s) if drive else self._hand(coro, backstop_s)

    def _drive(self, coro: Coroutine[Any, Any, Any], backstop_s: float) -> Any:
        """Run the loop in this thread (its driver) until `coro` ends, or `backstop_s` passes."""
        loop = self.loop
        here = [True]  # whether this thread still runs the loop for the call
        backstop = [False]

        async def driven() -> Any:
            try:
                return await coro
            finally:
                if here[0]:  # stop in the step that ends the call (run_until_complete takes two more turns)
                    loop.stop()

        def give_up() -> None:
            backstop[0] = True
            loop.stop()

        task: asyncio.Task[Any] | None = None
        try:
            task = loop.create_task(driven())
            timer = loop.call_later(backstop_s, give_up)
            try:
                loop.run_forever()
            finally:
                timer.cancel()
        finally:
            here[0] = False
            if task is None:
                coro.close()
            with self._cv:
                self._driver, self._released = None, time.monotonic()
                if task is not None and not task.done():  # cut off (the backstop, Ctrl-C): it runs on elsewhere
                    self._handed += 1
                    task.add_done_callback(self._unhand)
                    if backstop[0]:
                        loop.call_soon_threadsafe(task.cancel)
                if self._handed or self._waiting or self._hold:
                    self._cv.notify_all()
        if not task.done():  # the backstop: cancelled, and left to the toolset's thread
            raise FutureTimeout
        return task.result()

    def _hand(self, coro: Coroutine[Any, Any, Any], backstop_s: float) -> Any:
        """Hand `coro` to the loop another thread runs (the toolset's thread runs it if nobody does)."""
        with self._cv:
            if self.finished or self._main is None or self._main.done():
                coro.close()
                raise ToolsetError("the event loop has stopped")
            self._handed += 1
            self._cv.notify_all()
        try:
            try:
                future = asyncio.run_coroutine_threadsafe(coro, self.loop)
            except RuntimeError:  # the loop is closed
                coro.close()
                raise ToolsetError("the event loop has stopped") from None
            try:
                return future.result(backstop_s)
            except FutureTimeout:
                future.cancel()
                raise
        finally:
            self._unhand()

    def _unhand(self, _: object = None) -> None:
        with self._cv:
            self._handed -= 1


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks left on `loop` and let them end (as `asyncio.run` does at its end)."""
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


class _EscapedStderr:
    """A stdio server's stderr: a pipe whose lines a thread writes to proctor's own stderr escaped by
    `terminal_safe` (tabs kept), so what the server prints cannot drive the operator's terminal (erase
    lines, move the cursor, reorder text). Handed to the server as `writer`; the relay ends when the
    server's copy and ours (`close`) are both closed."""

    _CHUNK = 64 * 1024

    def __init__(self) -> None:
        read, write = os.pipe()
        self.writer = os.fdopen(write, "w")
        self._thread = threading.Thread(target=self._relay, args=(read,), name="proctor-mcp-stderr", daemon=True)
        self._thread.start()

    def _relay(self, read: int) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        with os.fdopen(read, "rb") as source:
            while True:
                line = source.readline(self._CHUNK)  # a line without an end is relayed a chunk at a time
                text = decoder.decode(line, final=not line)
                if text:
                    ended = text.endswith("\n")
                    shown = terminal_safe(text[:-1] if ended else text, keep_tabs=True) + ("\n" if ended else "")
                    try:
                        sys.stderr.write(shown)
                        sys.stderr.flush()
                    except (OSError, ValueError):  # our stderr is gone: the server's lines go nowhere
                        pass
                if not line:
                    return

    def close(self) -> None:
        """Close our copy; the server has exited by now, so its last lines are relayed before this returns (unless
        a process it started still holds the pipe: then they follow when it closes it)."""
        self.writer.close()
        self._thread.join(2)


#: The ids of the requests the current call sent (1.x; set in the task that makes the call).
_SENT: contextvars.ContextVar[list[Any]] = contextvars.ContextVar("proctor_mcp_sent")


class _NoteRequestIds:
    """The write stream a 1.x ClientSession sends on, noting the id of each request sent from a
    call's task (the session sends from the task that awaits the request)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def send(self, message: Any) -> None:
        ids = _SENT.get(None)
        if ids is not None:
            wire = _wire(message.message)
            if wire.get("method") == "tools/call" and "id" in wire:
                ids.append(wire["id"])
        await self.inner.send(message)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def close(self) -> None:
        self.inner.close()

    async def __aenter__(self) -> _NoteRequestIds:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


if sys.version_info >= (3, 11):
    async def _within(step: Awaitable[_T], limit: float) -> _T:
        """`step`, or `TimeoutError` after `limit` seconds (`step` is then cancelled). In the call's own
        task: `asyncio.wait_for` runs it in a task of its own, one more hop through the loop a call."""
        async with asyncio.timeout(limit):
            return await step
else:  # 3.10: no asyncio.timeout
    async def _within(step: Awaitable[_T], limit: float) -> _T:
        """`step`, or `TimeoutError` after `limit` seconds (`step` is then cancelled)."""
        return await asyncio.wait_for(step, limit)


def _wire(model: Any) -> dict[str, Any]:
    """A message of either SDK as it is on the wire (JSON, camelCase): one form for 1.x and 2.x."""
    if isinstance(model, pydantic.BaseModel):
        data = model.model_dump(by_alias=True, mode="json", exclude_none=True)
        return data if isinstance(data, dict) else {}
    return dict(model) if isinstance(model, Mapping) else {}


def _sent_args(tool: MCPTool, args: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments as sent: an optional argument left at None is left out (None means "not given"
    unless the schema's own default is something else, where None is sent as null). The names are
    found once, when the tool is made (`MCPTool.optional_nulls`), not on every call."""
    optional_nulls = tool.optional_nulls
    return {k: v for k, v in args.items() if not (k in optional_nulls and v is None)} if optional_nulls \
        else dict(args)


def _annotation(text: str) -> Any:
    """A real type where the text is a plain one (``str``, ``int``…), else the text as an annotation."""
    plain = {"str": str, "int": int, "float": float, "bool": bool, "None": None}
    return plain.get(text, TypeText(text)) if text != "None" else None


def _output_type(output: Mapping[str, Any] | None, rendered: Signature) -> str | None:
    if output is None or rendered.returns is None:
        return None
    return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(
        rendered.returns, "array" if rendered.returns.startswith("list[") else "object")


def _suggest_prefix(label: str) -> str:
    words = re.findall(r"[a-z]+", label.rsplit("/", 1)[-1].lower())
    word = next((w for w in reversed(words) if w not in {"server", "mcp", "py", "js", "main", "http"}), "srv")
    return word[:8] + "_"


def _clip(text: str, cap: int = 8000) -> str:
    return text if len(text) <= cap else text[:cap] + "…"


def _result_value(where: str, tool: MCPTool, result: Mapping[str, Any]) -> Any:
    """What a call returns: the structured content when there is some, else the text (or a description)."""
    content = result.get("content")
    items = [c for c in content if isinstance(c, Mapping)] if isinstance(content, list) else []
    texts = [str(c.get("text", "")) for c in items if c.get("type") == "text"]
    if result.get("isError"):
        said = text_safe(_clip(chr(10).join(texts), _TEXT_CAP))
        raise MCPToolFailed(f"{where}: {said or 'the server reported an error'}",
                            tool=tool.name, error_type="MCPToolFailed")
    structured = result.get("structuredContent")
    if structured is not None:
        if tool.rendered is not None and tool.rendered.wrapped_result and isinstance(structured, Mapping) \
                and set(structured) == {"result"}:
            return structured["result"]  # FastMCP wraps a value that is not an object as {"result": …}
        return structured
    others = [f"<{c.get('type', 'content')} {c.get('mimeType', '')}>".replace(" >", ">") for c in items
              if c.get("type") != "text"]
    parts = texts + others
    return parts[0] if len(parts) == 1 else "\n".join(parts) if parts else None


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0]


def _checked_schema(which: str, schema: dict[str, Any]) -> tuple[Any, str | None]:
    """A validator of a tool's `which` schema (a `$ref` beyond the schema is never fetched), or (None, why the tool
    cannot be offered with it): the schema is invalid, refers to what does not resolve within it, refers back to
    itself without end, or has regular expressions no check can bound (`proctor.jsoninput.unbounded_pattern_use`;
    any in an outputSchema)."""
    refused = "every call would be refused" if which == "inputSchema" else \
        "every result would be refused after the call ran"
    try:
        checker = local_schema_validator(schema)
        checker.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return None, (f"its {which} is invalid ({terminal_safe(exc.message[:200])}): {refused}; the server's schema "
                      "needs fixing")
    unresolved = unresolved_reference(schema, type(checker))
    if unresolved is not None:
        return None, _unresolved(which, *unresolved)
    cycle = reference_cycle(schema, type(checker))
    if cycle is not None:  # validating anything would recurse until the stack ran out
        at, ref = cycle
        return None, (f"its {which} refers to {terminal_safe(ref[:200])!r} (at {terminal_safe(at[:200]) or '/'}), "
                      f"which leads back there without end: {refused}; the server's schema needs fixing")
    if which == "inputSchema":  # proctor checks the arguments, each pattern within PATTERN_TIMEOUT_S (jsoninput)
        unbounded = unbounded_pattern_use(schema, type(checker))
        if unbounded is not None:
            return None, f"its inputSchema: {unbounded}; the server's schema needs fixing"
    elif regex_keywords(schema, type(checker)) & {"pattern", "patternProperties"}:
        # The SDK checks each result against it with Python's `re`, which nothing bounds: a server could stall the
        # process with a pattern that backtracks without end and an answer made for it.
        return None, ("its outputSchema has regular expressions (pattern, patternProperties), which the MCP SDK "
                      "checks every result against without a time bound: a server's answer could stall proctor; "
                      "the server's schema needs them taken out")
    return checker, None


def _unresolved(which: str, at: str, ref: str) -> str:
    """Why a tool whose `which` schema holds `ref` (at JSON pointer `at`), which does not resolve, is not offered."""
    return (f"its {which} refers to {terminal_safe(ref[:200])!r} (at {terminal_safe(at[:200]) or '/'}), which does "
            "not resolve within the schema; proctor resolves a $ref only there and fetches nothing: the server's "
            "schema needs fixing")


def _unreadable(exc: Exception) -> str:
    """What was wrong with a message the SDK could not parse, in one escaped line (located where it says where)."""
    if isinstance(exc, pydantic.ValidationError):
        errors = exc.errors(include_url=False, include_input=False)
        if errors:
            return terminal_safe(_clip(str(errors[0].get("msg", "")), 300)) or type(exc).__name__
    return terminal_safe(_clip(_first_line(_reason(exc)), 300))


def _innermost(exc: BaseException) -> BaseException:
    """The first error inside an exception group (anyio task groups raise them), or `exc`."""
    inner = getattr(exc, "exceptions", None)  # BaseExceptionGroup (3.11) or anyio's backport (3.10)
    while isinstance(inner, (list, tuple)) and inner and isinstance(inner[0], BaseException):
        exc = inner[0]
        inner = getattr(exc, "exceptions", None)
    return exc


def _reason(exc: BaseException) -> str:
    """One line for an error that may be an exception group."""
    exc = _innermost(exc)
    text = str(exc)
    if isinstance(exc, asyncio.CancelledError):
        return "the session was torn down (the server exited or the connection closed)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
