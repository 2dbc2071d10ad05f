"""`proctor policy check` validates through the models' generated core schema, without pydantic (#18.5)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from proctor.errors import PolicyError
from proctor.policy import Policy, fastcheck
from proctor.policy.loader import load_policy_text

ROOT = Path(__file__).resolve().parents[2]
POLICIES = sorted((ROOT / "examples").rglob("*.yaml"))

BROKEN = textwrap.dedent(
    """\
    version: 1
    let:
      mail: "tool == 'send_email'"
    default: maybe
    tools:
      get: {side_effect: read, durability: flush, timeout: 5, max_arg_bytes: 0}
      put: {durability: flush, cost: "args.n +", labels: ["bad label"], redact: [".x"]}
      calc: {side_effect: "args.x ? 'externa' : 'write'"}
    budgets:
      - name: b
        match: {}
        limit: {calls: -1, model_tokens: 5}
        per: step
        window: 1h
      - {name: c, limit: {}, per: "label:"}
    rules:
      - name: r
        match: {tool: [send_email, ""], side_effect: [reed]}
        when: "mail && usage['x'] > 1 &&"
        decision: permit
      - name: s
        when: "history.exists(mail, mail.tool == 'x')"
        decision: deny
        colour: red
    approval: {timeout: soon, on_timeout: allow}
    read_durability: never
    """
)


def test_generated_core_schema_is_current() -> None:
    """proctor/policy/_core_schema.py is exactly what the models generate now (regenerate it if not)."""
    assert fastcheck.GENERATED.read_text() == fastcheck.generate(), "run python -m proctor.policy.fastcheck --write"


@pytest.mark.parametrize("path", POLICIES, ids=[str(p.relative_to(ROOT)) for p in POLICIES])
def test_fast_and_model_validation_agree_on_every_example(path: Path) -> None:
    """Every example policy (and cases file) gives the same fields and fingerprint, or the same issues, both ways."""
    text = path.read_text()
    try:
        slow = Policy(load_policy_text(text, str(path)), str(path))
    except PolicyError as refused:
        with pytest.raises(PolicyError) as also:
            load_policy_text(text, str(path), fast=True)
        assert [str(i) for i in also.value.issues] == [str(i) for i in refused.issues]
        return
    fast = Policy(load_policy_text(text, str(path), fast=True), str(path))
    assert fast.model.model_dump() == slow.model.model_dump()
    assert fast.sha256 == slow.sha256
    assert [b.shared for b in fast.budgets] == [b.shared for b in slow.budgets]


def test_fast_and_model_validation_report_the_same_issues() -> None:
    """A policy with a mistake in nearly every field gets the very same located messages from both validators."""
    with pytest.raises(PolicyError) as slow:
        load_policy_text(BROKEN, "policy.yaml")
    with pytest.raises(PolicyError) as fast:
        load_policy_text(BROKEN, "policy.yaml", fast=True)
    assert [str(i) for i in fast.value.issues] == [str(i) for i in slow.value.issues]
    assert len(slow.value.issues) >= 15


@pytest.mark.process
def test_policy_check_imports_only_what_it_needs(tmp_path: Path) -> None:
    """`proctor policy check` runs without pydantic, rich, cryptography, OpenTelemetry, structlog or the agent."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nrules:\n  - {name: r, when: \"normalize(args.to).endsWith('@x.com')\", "
                      "decision: allow}\n")
    code = ("import sys; from proctor.cli import main; code = main(['policy', 'check', sys.argv[1]]); "
            "print(' '.join(sorted(sys.modules)), file=sys.stderr); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code, str(policy)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ": ok (1 rules" in done.stdout
    loaded = set(done.stderr.split())
    heavy = {"pydantic", "rich", "cryptography", "opentelemetry", "structlog", "litellm", "smolagents", "typer",
             "prompt_toolkit", "fastapi", "cel.cli", "proctor.agent.base", "proctor.gate", "proctor.telemetry.otel"}
    assert not {m for m in loaded if m in heavy or m.split(".")[0] in heavy - {"cel.cli"}}
    assert "cel.cel" in loaded  # the conditions were compiled


def test_records_read_like_the_models() -> None:
    """A fast-validated policy answers the engine's questions (facts, budgets) as the model-validated one does."""
    text = textwrap.dedent(
        """\
        version: 1
        tools:
          pay: {side_effect: destructive, cost: "args.amount", timeout: 2s}
        budgets:
          - {name: team, limit: {cost: 100}, per: label:team, window: 24h}
        rules:
          - {name: pay, match: {tool: pay}, decision: require_approval}
        """
    )
    slow = Policy(load_policy_text(text, "p.yaml"), "p.yaml")
    fast = Policy(load_policy_text(text, "p.yaml", fast=True), "p.yaml")
    assert type(fast.model).__name__ == "PolicyModel" and type(fast.model) is not type(slow.model)
    assert fast.facts("pay").timeout_s == slow.facts("pay").timeout_s == 2.0
    assert fast.cost_of("pay", {"amount": 7}) == slow.cost_of("pay", {"amount": 7}) == 7
    assert (fast.budgets[0].label_key, fast.budgets[0].shared) == (slow.budgets[0].label_key, True) == ("team", True)
    assert fast.approval == slow.approval


def test_another_pydantic_core_release_falls_back_to_the_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a pydantic-core other than the one that wrote the schema, the models validate: same issues, real models."""
    from proctor.policy import _core_schema
    from proctor.policy.schema import PolicyModel

    monkeypatch.setattr(_core_schema, "PYDANTIC_CORE_VERSION", "0.0.0")
    fastcheck.usable.cache_clear()
    try:
        assert not fastcheck.usable()
        assert isinstance(load_policy_text("version: 1\n", "p.yaml", fast=True), PolicyModel)
        with pytest.raises(PolicyError) as fallback:
            load_policy_text(BROKEN, "policy.yaml", fast=True)
        with pytest.raises(PolicyError) as models:
            load_policy_text(BROKEN, "policy.yaml")
        assert [str(i) for i in fallback.value.issues] == [str(i) for i in models.value.issues]
    finally:
        monkeypatch.undo()
        fastcheck.usable.cache_clear()
    assert fastcheck.usable()
