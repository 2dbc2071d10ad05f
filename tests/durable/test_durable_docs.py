"""docs/durable.md stays true: every command it shows exists, with the options it shows."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from proctor.cli import build_parser

DOC = (Path(__file__).parents[2] / "docs" / "durable.md").read_text(encoding="utf-8")


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            found: argparse.ArgumentParser = action.choices[name]
            return found
    raise AssertionError(f"no subcommand {name!r}")


def test_every_command_in_the_doc_exists_with_its_options() -> None:
    """Each `proctor approvals|runs ACTION --option` line of the doc names a real action and real options."""
    lines = re.findall(r"^\$ proctor (approvals|runs) +([\w-]+)(.*)$", DOC, re.M)
    assert len(lines) >= 9
    parser = build_parser()
    for group, action, rest in lines:
        sub = _subparser(_subparser(parser, group), action)
        known = {opt for a in sub._actions for opt in a.option_strings}
        for option in re.findall(r"(--[a-z-]+)", rest):
            assert option in known, f"proctor {group} {action} has no {option}"


def test_the_policy_key_it_shows_is_accepted() -> None:
    """The `idempotent: true` example is a valid policy entry."""
    from proctor import Policy

    policy = Policy.from_dict({"version": 1, "tools": {"refresh_cache": {"side_effect": "write", "idempotent": True}}})
    assert policy.model.tools["refresh_cache"].idempotent is True
