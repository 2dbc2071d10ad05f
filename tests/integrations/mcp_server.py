"""A real MCP server (the SDK's FastMCP, MCPServer in mcp 2.x) for the MCPToolset tests: stdio by
default, `http PORT` for HTTP (answers as SSE streams), `http-json PORT` for HTTP answering JSON bodies."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from mcp.types import ToolAnnotations
from typing_extensions import TypedDict

try:
    from mcp.server.fastmcp import FastMCP as Server  # mcp 1.x
    from mcp.server.fastmcp.exceptions import ToolError
    V2 = False
except ModuleNotFoundError:  # mcp 2.x renamed it
    from mcp.server.mcpserver import MCPServer as Server  # type: ignore[no-redef]
    from mcp.server.mcpserver.exceptions import ToolError  # type: ignore[no-redef]
    V2 = True

server = Server("proctor-test")
LOG = Path(sys.argv[3]) if len(sys.argv) > 3 else None


def _ran(name: str) -> None:
    if LOG is not None:
        with LOG.open("a") as fh:
            fh.write(name + "\n")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def get_weather(city: str, units: str = "metric") -> str:
    """Tell the weather in a city."""
    _ran("get_weather")
    return f"sunny in {city} ({units})"


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
def delete_file(path: str) -> str:
    """Delete a file."""
    _ran("delete_file")
    return f"deleted {path}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False, openWorldHint=True))
def fetch_url(url: str) -> str:
    """Fetch a URL."""
    _ran("fetch_url")
    return f"fetched {url}"


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    _ran("add")
    return a + b


@server.tool(name="get-stats")
def stats(values: list[float]) -> dict[str, float]:
    """Sum and mean of some numbers."""
    _ran("get-stats")
    return {"sum": sum(values), "mean": sum(values) / len(values)}


@server.tool()
def explode(message: str) -> str:
    """Always fails (a ToolError: 2.x hides other exceptions' messages from clients)."""
    raise ToolError(message)


@server.tool(annotations=ToolAnnotations(readOnlyHint=True, destructiveHint=True))
def wipe_disk(disk: str) -> str:
    """Claims to be read-only."""
    _ran("wipe_disk")
    return f"wiped {disk}"


@server.tool()
async def slow_write(path: str, seconds: float) -> str:
    """Write a file after a while (or log that it was cancelled first)."""
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        _ran("cancelled:slow_write")
        raise
    Path(path).write_text("written")
    _ran("slow_write")
    return "written"


@server.tool()
def die() -> str:
    """The server exits in the middle of the call."""
    _ran("die")
    import os

    os._exit(7)


@server.tool()
def huge(megabytes: int) -> str:
    """An answer of `megabytes` MB."""
    return "z" * (megabytes << 20)


class Address(TypedDict):
    street: str
    zip: str | None


@server.tool()
def ship(to: Address, count: int, note: str | None = None, express: bool = False) -> dict[str, str]:
    """Ship a parcel."""
    return {"to": to["street"], "count": str(count)}


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] in ("http", "http-json"):
        json_response = sys.argv[1] == "http-json"
        if V2:
            server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[2]),
                       json_response=json_response)
        else:
            server.settings.host = "127.0.0.1"
            server.settings.port = int(sys.argv[2])
            server.settings.json_response = json_response
            server.run(transport="streamable-http")
    else:
        server.run()
