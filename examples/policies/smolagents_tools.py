"""The real tools of `smolagents.yaml`: the smolagents `@tool`s of `examples/smolagents_agent.py`, as they are.

    proctor policy test examples/policies/smolagents.yaml examples/policies/smolagents.cases.yaml \\
        --tools examples.policies.smolagents_tools:TOOLS
"""

from __future__ import annotations

from examples.smolagents_agent import book_table, get_weather

__all__ = ["TOOLS"]

TOOLS = [get_weather, book_table]
