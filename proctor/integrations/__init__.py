"""Govern agents built with other libraries: `proctor.integrations.smolagents` (extra
``proctor[smolagents]``) and `proctor.integrations.mcp` (extra ``proctor[mcp]``).

Each submodule imports its library when it is imported; this package imports nothing.
"""

__all__: list[str] = []
