"""The example policies are valid, their cases pass under `policy test`, and the shipped schema is current."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proctor.cli import main
from proctor.policy import Policy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "policies"
POLICIES = sorted(p for p in EXAMPLES.glob("*.yaml") if not p.name.endswith(".cases.yaml"))


def test_there_are_at_least_three_examples() -> None:
    """support, analytics and finance ship, each with cases."""
    names = {p.stem for p in POLICIES}
    assert {"support", "analytics", "finance"} <= names
    for policy in POLICIES:
        assert policy.with_suffix(".cases.yaml").exists(), f"{policy.name} has no cases"


@pytest.mark.parametrize("policy", POLICIES, ids=[p.stem for p in POLICIES])
def test_example_cases_pass(policy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`proctor policy test P P.cases.yaml` exits 0 for every example."""
    code = main(["policy", "test", str(policy), str(policy.with_suffix(".cases.yaml"))])
    out = capsys.readouterr().out
    assert code == 0, out
    assert " 0 failed" in out


@pytest.mark.parametrize("policy", POLICIES, ids=[p.stem for p in POLICIES])
def test_example_uses_every_rule(policy: Path) -> None:
    """Each example's cases exercise every rule at least once (no dead rules in examples)."""
    from proctor.policy.cases import load_cases, run_cases

    loaded = Policy.from_yaml(policy)
    cases_path = policy.with_suffix(".cases.yaml")
    results = run_cases(loaded, load_cases(cases_path.read_text(), str(cases_path)))
    used = {name for r in results for name in r.decision.rules}
    assert used == {r.name for r in loaded.rules}


def test_shipped_schema_is_current(capsys: pytest.CaptureFixture[str]) -> None:
    """examples/policies/policy.schema.json equals `proctor policy schema` (regenerate it if not)."""
    assert main(["policy", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads((EXAMPLES / "policy.schema.json").read_text())
