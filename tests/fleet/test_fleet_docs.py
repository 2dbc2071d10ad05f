"""docs/fleet.md and examples/fleet/ stay true: the compose file, its policy and tools, the names it uses."""

from __future__ import annotations

from pathlib import Path

import yaml

from proctor import Policy
from proctor.cli import main

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "examples" / "fleet"


def test_compose_has_every_part_of_the_picture() -> None:
    """The compose file runs Redis, PostgreSQL, a collector, the inbox and workers with the documented settings."""
    compose = yaml.safe_load((FLEET / "compose.yaml").read_text())
    assert set(compose["services"]) == {"redis", "postgres", "otel-collector", "inbox", "worker"}
    redis_args = compose["services"]["redis"]["command"]
    assert redis_args[redis_args.index("--appendfsync") + 1] == "always"
    assert "synchronous_commit=on" in compose["services"]["postgres"]["command"]
    env = compose["services"]["worker"]["environment"]
    assert env["PROCTOR_LEDGER"].startswith("redis://") and env["PROCTOR_AUDIT"].startswith("postgresql://")
    assert env["PROCTOR_STORE"].startswith("postgresql://")


def test_example_policy_is_valid_and_its_budgets_are_shared(capsys: object) -> None:
    """The fleet policy loads, every rule names a tool of tools.py, and its team budgets are shared ones."""
    policy = Policy.from_yaml(FLEET / "policy.yaml")
    assert {b.per for b in policy.budgets} == {"global", "principal", "label:team", "run"}
    assert main(["policy", "check", str(FLEET / "policy.yaml")]) == 0
    source = (FLEET / "tools.py").read_text()
    for name in policy.model.tools:
        assert f"def {name}(" in source


def test_docs_name_what_the_code_reads() -> None:
    """docs/fleet.md names the environment variables, URL options and errors the code uses."""
    text = (ROOT / "docs" / "fleet.md").read_text()
    for name in ("PROCTOR_LEDGER", "PROCTOR_STORE", "PROCTOR_AUDIT", "PROCTOR_AUDIT_KEY", "lease", "timeout",
                 "LedgerUnavailable", "AuditError", "synchronous_commit", "appendfsync", "LISTEN proctor_approvals",
                 "proctor audit export", "per: global", "window: 24h"):
        assert name in text, name
