"""docs/policy.md stays true: its full example loads and each `when:` example compiles."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from proctor.calls import Call, RunInfo
from proctor.policy import Policy
from proctor.policy.conditions import compile_condition

DOC = (Path(__file__).resolve().parents[2] / "docs" / "policy.md").read_text()
WHENS = re.findall(r"^(when: .*?)(?:\s+#.*)?$", DOC, flags=re.MULTILINE)


def test_the_whole_file_example_is_a_valid_policy() -> None:
    """The first yaml block of the page is a policy that loads."""
    block = re.search(r"```yaml\n(# yaml-language-server.*?)```", DOC, flags=re.DOTALL)
    assert block is not None
    policy = Policy.from_string(block.group(1))
    assert [r.name for r in policy.rules] == ["reads", "internal-mail", "external-mail", "no-exfiltration"]


@pytest.mark.parametrize("line", WHENS)
def test_when_examples_compile(line: str) -> None:
    """Every `when:` example parses as YAML and compiles as CEL."""
    compile_condition(yaml.safe_load(line)["when"])


def test_there_are_when_examples() -> None:
    """The page keeps its CEL examples."""
    assert len(WHENS) >= 8


def test_documented_error_absorption() -> None:
    """`&&` with a false side is false even when the other side errors, as documented."""
    policy = Policy.from_dict({"version": 1, "default": "allow", "rules": [
        {"name": "r", "when": "run.labels.env == 'prod' && run.principal == 'bob'", "decision": "deny"}]})
    assert policy.decide(Call("t", run=RunInfo(principal="alice"))).outcome == "allow"
    assert policy.decide(Call("t", run=RunInfo(principal="bob"))).outcome == "deny"
