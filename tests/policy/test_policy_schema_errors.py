"""`proctor policy schema` reports a bad value precisely in check-jsonschema, not as "not of type 'null'"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from proctor.cli import main

BAD = """\
version: 1
tools:
  get_weather: {side_effect: reed, cost: -1}
  slow: {timeout: 30}
budgets:
  - name: b
    match: {tool: 5}
    limit: {calls: "5"}
rules:
  - name: r
    match: {side_effect: [read, reed]}
    decision: alow
"""

EXPECTED = [
    "$.budgets[0].limit.calls: '5' is not of type 'integer'",
    "$.budgets[0].match.tool: 5 is not of type 'string'",
    "$.rules[0].decision: 'alow' is not one of ['allow', 'deny', 'require_approval']",
    "$.rules[0].match.side_effect[1]: 'reed' is not one of ['none', 'read', 'write', 'external', 'destructive']",
    "$.tools.slow.timeout: 30 is not of type 'string'",
    "$.tools.get_weather.cost: -1 is less than the minimum of 0",
    "$.tools.get_weather.side_effect: 'reed' is not one of ['none', 'read', 'write', 'external', 'destructive']",
]


@pytest.fixture
def schema_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert main(["policy", "schema"]) == 0
    path = tmp_path / "policy.schema.json"
    path.write_text(capsys.readouterr().out)
    return path


def _check(schema: Path, document: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--schemafile", str(schema), str(document)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.process
def test_each_mistake_is_named_at_its_path(schema_file: Path, tmp_path: Path) -> None:
    """Every mistake gets one line naming its path and what was expected; no "any of the given schemas"."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    result = _check(schema_file, bad)
    assert result.returncode == 1
    lines = [line.strip().split("::", 1)[1] for line in result.stdout.splitlines() if "::$" in line]
    assert sorted(lines) == sorted(EXPECTED)
    assert "any of the given schemas" not in result.stdout
    assert "'null'" not in result.stdout


@pytest.mark.process
def test_examples_validate(schema_file: Path) -> None:
    """Every shipped example policy is valid under the schema."""
    examples = Path(__file__).resolve().parents[2] / "examples" / "policies"
    for policy in sorted(examples.glob("*.yaml")):
        if not policy.name.endswith(".cases.yaml"):
            assert _check(schema_file, policy).returncode == 0, policy.name


def test_no_null_branches(schema_file: Path) -> None:
    """Optional keys are left out in YAML, never null: the schema has no null branches."""
    assert '"null"' not in json.dumps(json.loads(schema_file.read_text()))
