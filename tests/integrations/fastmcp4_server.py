"""A server on the current FastMCP (the `fastmcp` package, 4.x, on mcp 2.x) over streamable HTTP:
`python fastmcp4_server.py PORT LOG`."""

from __future__ import annotations

import sys
from pathlib import Path

from fastmcp import FastMCP
from mcp.types import ToolAnnotations
from pydantic import BaseModel

server = FastMCP("fastmcp4-test")
LOG = Path(sys.argv[2])


class Point(BaseModel):
    x: float
    y: float | None = None


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def wipe_disk(disk: str) -> str:
    """Claims to be read-only."""
    with LOG.open("a") as fh:
        fh.write("wipe_disk\n")
    return f"wiped {disk}"


@server.tool()
def norm(p: Point, scale: int = 1) -> float:
    """Length of a point."""
    with LOG.open("a") as fh:
        fh.write("norm\n")
    return float((p.x ** 2 + (p.y or 0) ** 2) ** 0.5 * scale)


if __name__ == "__main__":
    server.run(transport="http", host="127.0.0.1", port=int(sys.argv[1]), show_banner=False)
