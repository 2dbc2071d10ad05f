"""MCP servers' tools as proctor tools (extra ``proctor[mcp]``, the official ``mcp`` SDK).

```python
from mcp import StdioServerParameters
from proctor.integrations.mcp import MCPToolset

with MCPToolset(StdioServerParameters(command="python", args=["server.py"])) as tools:
    agent = CodeAgent(tools=tools, model=…, policy="policy.yaml")
    agent.run("…")
with MCPToolset("http://127.0.0.1:8000/mcp") as tools:   # streamable HTTP
    …
```

Each MCP tool becomes a proctor `Tool`: its ``inputSchema`` is the schema shown to models
and every call's arguments are validated against it (a call that does not fit is refused
before anything runs); its annotations give its side-effect class when the policy's
``tools:`` section does not (``readOnlyHint`` → read, ``destructiveHint`` → destructive,
``openWorldHint`` → external, otherwise write). Calls go through the gate like any other.
A name that is not a Python identifier (``get-time``) is called as ``get_time`` in programs.

The SDK is asynchronous; the toolset runs its session on an event loop of its own thread,
so tools are called from synchronous code (the gate, the interpreter) and from async code alike.
"""

from __future__ import annotations

import asyncio
import inspect
import keyword
import re
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import jsonschema
import pydantic
from mcp import ClientSession, StdioServerParameters
from mcp import types as mcp_types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from proctor.calls import SideEffect
from proctor.errors import ConfigurationError, ToolFailed, ToolsetError
from proctor.tools import Tool

__all__ = ["MCPToolFailed", "MCPToolset", "side_effect_of"]

_JSON_TYPES: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool,
                               "array": list[Any], "object": dict[str, Any], "null": type(None)}


class MCPToolFailed(ToolFailed):
    """The MCP server answered the call with an error (``isError``); the gate records the call as failed."""


def side_effect_of(annotations: mcp_types.ToolAnnotations | None) -> SideEffect:
    """The side-effect class an MCP tool's annotations declare (write when they declare nothing)."""
    if annotations is None:
        return "write"
    if annotations.readOnlyHint:
        return "read"
    if annotations.destructiveHint:
        return "destructive"
    if annotations.openWorldHint:
        return "external"
    return "write"


class MCPToolset:
    """A context manager connected to one MCP server, yielding its tools as proctor `Tool`s.

    `server` is ``mcp.StdioServerParameters`` (a server started as a subprocess) or the URL of a
    streamable HTTP endpoint (``http://host:port/mcp``, with `headers`). `timeout` bounds starting,
    listing and each call (seconds). `prefix` is put before every tool's name (``fs_`` → ``fs_read``).
    """

    def __init__(self, server: StdioServerParameters | str, *, timeout: float = 30, prefix: str = "",
                 headers: Mapping[str, str] | None = None) -> None:
        if not isinstance(server, (StdioServerParameters, str)):
            raise ConfigurationError(f"MCPToolset takes mcp.StdioServerParameters or an http(s) URL, "
                                     f"not a {type(server).__name__}")
        if isinstance(server, str) and not re.match(r"^https?://", server):
            raise ConfigurationError(f"an MCP server URL must start with http:// or https://, got {server!r}")
        if timeout <= 0:
            raise ConfigurationError("timeout must be positive seconds")
        self.server, self.timeout, self.prefix = server, float(timeout), prefix
        self.headers = dict(headers or {})
        self.tools: list[Tool] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: ClientSession | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready: Future[list[mcp_types.Tool]] = Future()

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> list[Tool]:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> list[Tool]:
        """Start (or connect to) the server and list its tools; raise `ToolsetError` if that fails."""
        if self._thread is not None:
            return self.tools
        self._thread = threading.Thread(target=self._run, name="proctor-mcp", daemon=True)
        self._thread.start()
        try:
            listed = self._ready.result(self.timeout)
        except TimeoutError:
            self.close()
            raise ToolsetError(f"the MCP server {self._label()} did not answer within {self.timeout:g}s") from None
        except ToolsetError:
            self.close()
            raise
        self.tools = [self._tool(t) for t in listed]
        return self.tools

    def close(self) -> None:
        """End the session (and stop a stdio server)."""
        loop, stop, thread = self._loop, self._stop, self._thread
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop already stopped
                pass
        if thread is not None:
            thread.join(self.timeout)
        self._thread = None

    def _label(self) -> str:
        if isinstance(self.server, str):
            return self.server
        return " ".join([self.server.command, *self.server.args])

    # -- the session, on its own event loop ------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported to open(), which raises it
            if not self._ready.done():
                self._ready.set_exception(ToolsetError(f"the MCP server {self._label()} failed: "
                                                       f"{_reason(exc)}"))

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if isinstance(self.server, str):
            async with create_mcp_http_client(headers=self.headers) as http, \
                    streamable_http_client(self.server, http_client=http) as (read, write, _):
                await self._serve(read, write)
        else:
            async with stdio_client(self.server) as (read, write):
                await self._serve(read, write)

    async def _serve(self, read: Any, write: Any) -> None:
        async with ClientSession(read, write, read_timeout_seconds=timedelta(seconds=self.timeout)) as session:
            await session.initialize()
            listed: list[mcp_types.Tool] = []
            cursor: str | None = None
            while True:
                page = await session.list_tools(cursor=cursor) if cursor else await session.list_tools()
                listed.extend(page.tools)
                cursor = page.nextCursor
                if not cursor:
                    break
            self._session = session
            self._ready.set_result(listed)
            assert self._stop is not None
            await self._stop.wait()
            self._session = None

    def _call(self, name: str, args: Mapping[str, Any], output_schema: Mapping[str, Any] | None = None) -> Any:
        loop, session = self._loop, self._session
        if loop is None or session is None or loop.is_closed():
            raise ToolsetError(f"the MCP session with {self._label()} is closed: use the tools inside `with`")
        future = asyncio.run_coroutine_threadsafe(session.call_tool(name, dict(args)), loop)
        try:
            result = future.result(self.timeout)
        except TimeoutError:
            future.cancel()
            raise
        return _result_value(name, result, output_schema)

    # -- tools -----------------------------------------------------------------------------------

    def _tool(self, spec: mcp_types.Tool) -> Tool:
        name = self.prefix + re.sub(r"\W", "_", spec.name)
        if not name.isidentifier() or keyword.iskeyword(name):
            name = "mcp_" + name
        schema: dict[str, Any] = dict(spec.inputSchema or {"type": "object"})
        schema.setdefault("type", "object")
        try:
            checker = jsonschema.validators.validator_for(schema)(schema)
            checker.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise ToolsetError(f"MCP tool {spec.name!r} has an invalid inputSchema: {exc.message}") from None
        props: dict[str, Any] = schema.get("properties") or {}
        required = set(schema.get("required") or ())
        fields: dict[str, Any] = {}
        params: list[inspect.Parameter] = []
        docs: dict[str, str] = {}
        for arg, prop in props.items():
            if not isinstance(arg, str) or not arg.isidentifier() or keyword.iskeyword(arg):
                raise ToolsetError(f"MCP tool {spec.name!r}: argument {arg!r} is not a Python identifier")
            prop = prop if isinstance(prop, dict) else {}
            docs[arg] = str(prop.get("description") or prop.get("title") or "")
            default: Any = inspect.Parameter.empty if arg in required else prop.get("default")
            # Types are checked against the full JSON Schema below; pydantic only binds and refuses extras.
            fields[arg] = (Any, pydantic.Field(... if default is inspect.Parameter.empty else default,
                                               description=docs[arg]))
            params.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=default,
                                            annotation=_annotation(prop)))
        params.sort(key=lambda p: p.default is not inspect.Parameter.empty)  # required ones first
        params = [p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params]
        description = (spec.description or spec.title or f"MCP tool {spec.name}").strip()
        original = spec.name

        def call(**kwargs: Any) -> Any:
            sent = {k: v for k, v in kwargs.items() if k in required or v is not None}
            return self._call(original, sent, spec.outputSchema)

        def check(args: Mapping[str, Any]) -> str | None:
            sent = {k: v for k, v in args.items() if k in required or v is not None}
            errors = sorted(checker.iter_errors(sent), key=lambda e: list(e.path))
            if not errors:
                return None
            return "; ".join(f"argument {'.'.join(str(p) for p in e.path) or 'arguments'!r}: {e.message}"
                             for e in errors[:5])

        call.__name__ = name
        call.__doc__ = description
        return Tool._build(name, description, call, fields, inspect.Signature(params), docs,
                           side_effect=side_effect_of(spec.annotations), cost=0, source=spec,
                           schema=schema, check=check)


def _annotation(prop: Mapping[str, Any]) -> Any:
    kind = prop.get("type")
    if isinstance(kind, str) and kind in _JSON_TYPES:
        return _JSON_TYPES[kind]
    return Any


def _result_value(name: str, result: mcp_types.CallToolResult, output_schema: Mapping[str, Any] | None) -> Any:
    """What a call returns: the structured content when there is some, else the text (or a description)."""
    texts = [c.text for c in result.content if isinstance(c, mcp_types.TextContent)]
    if result.isError:
        raise MCPToolFailed("\n".join(texts) or f"the MCP server reported an error from {name}", tool=name,
                            error_type="MCPToolFailed")
    structured = result.structuredContent
    if structured is not None:
        wrapped = set((output_schema or {}).get("properties") or ()) == {"result"}
        if wrapped and set(structured) == {"result"}:
            return structured["result"]  # FastMCP wraps a value that is not an object as {"result": …}
        return structured
    others = [f"<{type(c).__name__}>" for c in result.content if not isinstance(c, mcp_types.TextContent)]
    parts = texts + others
    return parts[0] if len(parts) == 1 else "\n".join(parts) if parts else None


def _reason(exc: BaseException) -> str:
    """One line for an error that may be an exception group (anyio task groups raise them)."""
    inner = getattr(exc, "exceptions", None)
    while inner:
        exc = inner[0]
        inner = getattr(exc, "exceptions", None)
    return f"{type(exc).__name__}: {exc}"
