"""Governed code mode for MCP clients: ``proctor mcp serve`` (see `proctor.codemode.server`, docs/code-mode.md)."""

__all__: list[str] = []
