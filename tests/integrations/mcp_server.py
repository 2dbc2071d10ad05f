"""A real MCP server (the SDK's FastMCP) for the MCPToolset tests: stdio by default, `http PORT` for HTTP."""

from __future__ import annotations

import sys
from pathlib import Path

from mcp.server.fastmcp import FastMCP
from mcp.types import ToolAnnotations

server = FastMCP("proctor-test")
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
    """Always fails."""
    raise RuntimeError(message)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.settings.host = "127.0.0.1"
        server.settings.port = int(sys.argv[2])
        server.run(transport="streamable-http")
    else:
        server.run()
