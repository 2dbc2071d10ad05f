"""Shared tools and policy for the agent tests."""

from __future__ import annotations

from typing import Any

import pytest

from proctor.policy import Policy
from proctor.tools import Tool, tool

PRICES = {"apple": 1.5, "pear": 2.0, "plum": 0.5, "fig": 3.0}


@tool(side_effect="read")
def get_price(item: str) -> float:
    """The price of an item.

    Args:
        item: The item's name.
    """
    return PRICES[item]


@tool(side_effect="external")
def send_note(to: str, text: str) -> str:
    """Send a short note.

    Args:
        to: Who gets it.
        text: What it says.
    """
    return f"sent to {to}"


@tool(side_effect="destructive")
def delete_item(item: str) -> str:
    """Delete an item from the catalogue.

    Args:
        item: The item's name.
    """
    raise AssertionError("a denied tool must never run")


TOOLS: list[Tool] = [get_price, send_note, delete_item]


def policy_data(**extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "version": 1,
        "default": "deny",
        "budgets": [{"name": "run-calls", "limit": {"calls": 30}}],
        "rules": [
            {"name": "reads", "match": {"side_effect": ["none", "read"]}, "decision": "allow"},
            {"name": "team-notes", "match": {"tool": "send_note"}, "when": "args.to == 'team'", "decision": "allow"},
            {"name": "other-notes", "match": {"tool": "send_note"}, "when": "args.to != 'team'",
             "decision": "require_approval", "reason": "notes outside the team need a human"},
            {"name": "no-deletes", "match": {"tool": "delete_item"}, "decision": "deny",
             "reason": "nothing is deleted"},
        ],
    }
    data.update(extra)
    return data


@pytest.fixture
def policy() -> Policy:
    return Policy.from_dict(policy_data())


def program(code: str, thought: str = "Thought: next.") -> str:
    """A model answer holding `code` in a python fence."""
    return f"{thought}\n```python\n{code.strip()}\n```"
