"""Admission is the only reader of the engine's decision: nothing else in proctor/ calls a policy's
`decide`, `facts`, `cost_of`, `side_effect_of` or `fixed_decision` (issue 33, "one decision").

Everything that needs them — the gate, an approver's edit, `policy test`/`explain`, replay, the
shadow policy, a call refused before its arguments were read (`Gate.refuse`), prompts, lint —
goes through `proctor.policy.admission` (`admit`, `facts_of`, `class_over_args`,
`has_fixed_decision`, `decide_call`).
"""

from __future__ import annotations

import ast
from pathlib import Path

from proctor import Gate, Policy, tool
from proctor.narrowing import Layer, StackedLedger

PACKAGE = Path(__file__).resolve().parents[2] / "proctor"
ENGINE_READS = frozenset({"decide", "facts", "cost_of", "side_effect_of", "fixed_decision"})
#: Admission itself, and the engine (a policy deciding with its own methods).
ALLOWED = {PACKAGE / "policy" / "admission.py", PACKAGE / "policy" / "engine.py"}


def _engine_reads(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ENGINE_READS:
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: .{func.attr}(…)")
        # getattr(policy, "facts", None) and the like: a probe is a read too
        if (isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in ENGINE_READS):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: getattr(…, {node.args[1].value!r})")
    return found


def test_only_admission_reads_the_engines_decision() -> None:
    files = sorted(p for p in PACKAGE.rglob("*.py") if p not in ALLOWED)
    assert len(files) > 100  # the walk reaches the whole package
    found = [hit for path in files for hit in _engine_reads(path)]
    assert found == [], "call these through proctor.policy.admission instead:\n" + "\n".join(found)


def test_the_walk_finds_a_read() -> None:
    """The check above is not vacuous: admission's own module is full of them."""
    assert any(".facts(" in hit for hit in _engine_reads(PACKAGE / "policy" / "admission.py"))
    assert any(".decide(" in hit for hit in _engine_reads(PACKAGE / "policy" / "admission.py"))


@tool(side_effect="read")
def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: The key.
    """
    return key


RUN_POLICY = {"version": 1, "default": "allow", "tools": {"lookup": {"side_effect": "read"}}}
LAYER_POLICY = {"version": 1, "default": "allow", "tools": {"lookup": {"side_effect": "external"}}}


def test_a_call_refused_unread_gets_the_facts_admission_gives() -> None:
    """`Gate.refuse` (arguments over a size limit, never decoded) records the tool's class from admission's
    `facts_of`: the run policy's, made strictest by a managed agent's own policy."""
    gate = Gate(Policy.from_dict(RUN_POLICY), tools=[lookup])
    ctx = gate.start_run()
    plain = gate.refuse("lookup", "lookup: refused: too big", context=ctx, args_bytes=10)
    assert plain.record.status == "denied" and plain.record.side_effect == "read"

    own = Policy.from_dict(LAYER_POLICY)
    layer = Layer("helper", own, own.new_ledger(ctx.info))
    agent = ctx.delegate("helper", ledger=StackedLedger(ctx.ledger, layer.ledger, agent="helper"),
                         tools=gate.tools, layer=layer, parent_call_id="call_parent")
    narrowed = gate.refuse("lookup", "lookup: refused: too big", context=agent, args_bytes=10)
    assert narrowed.record.status == "denied" and narrowed.record.side_effect == "external"
