"""CEL conditions: compile-time checks, run-time failures, and the projection of variables."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiers import examples

from proctor.calls import Call, HistoryEntry, RunInfo
from proctor.policy.activation import Activation
from proctor.policy.conditions import ConditionError, EvaluationError, compile_condition
from proctor.policy.projection import merge_needs, needs_of


@pytest.mark.parametrize(("source", "line", "column", "message"), [
    ("args.to.endsWith(", 1, 18, "when: CEL syntax error: mismatched input '<EOF>'"),
    ("args.a == 1 &&\n  * 2", 2, 3, "when: CEL syntax error: extraneous input '*'"),
    ("arg.x == 1", 1, 1, "when: unknown variable 'arg' (did you mean 'args'? variables: tool, args, side_effect, "
     "history, run, usage, seen)"),
    ("args.x == 1 && sizes(args) > 1", 1, 16, "when: unknown function 'sizes' (did you mean 'size'?)"),
    ("qqqqq(1, 2) == 2", 1, 1, "when: unknown function 'qqqqq'"),
])
def test_compile_errors_are_located(source: str, line: int, column: int, message: str) -> None:
    """Syntax errors, unknown variables and unknown functions carry their position in the expression."""
    with pytest.raises(ConditionError) as caught:
        compile_condition(source)
    assert (caught.value.line, caught.value.column, caught.value.message) == (line, column, message)


@pytest.mark.parametrize("source", [
    "size(args) > 0 && args.a.startsWith('x') && args.a.contains('y') && args.a.matches('^x')",
    "int(args.n) + 1 > 0 && double(args.n) > 0.0 && string(args.n) != '' && uint(1) == 1u",
    "timestamp('2024-01-01T00:00:00Z').getFullYear() == 2024 && duration('1s') > duration('0s')",
    "history.exists(h, h.tool == 'x') || history.all(h, h.status == 'ok') || history.exists_one(h, true)",
    "history.map(h, h.tool).size() >= 0 && history.filter(h, h.tool == 'x').size() == 0",
    "type(args.n) == int && dyn(args.n) == 1 && has(args.n) && 'n' in args",
])
def test_standard_functions_and_macros_compile_and_run(source: str) -> None:
    """Every function the checker accepts runs on the native CEL library."""
    condition = compile_condition(source)
    result = condition.evaluate({"args": {"n": 1, "a": "xy"}, "history": [], "tool": "t", "side_effect": "read",
                                 "run": {}, "usage": {}})
    assert isinstance(result, bool)


def test_comprehension_variables_are_not_unknown() -> None:
    """Names bound by macros are not taken for unknown variables, and only real variables are kept."""
    condition = compile_condition("history.exists(c, c.tool == 'x') && args.items.all(i, i > 0)")
    assert condition.variables == ("args", "history")


@pytest.mark.parametrize(("source", "args", "message"), [
    ("args.to == 'x'", {}, "no such key 'to' in args"),
    ("args['to'] == 'x'", {}, "no such key 'to' in args"),
    ("args.n * 2 > 1", {"n": 1.5}, "Unsupported operation: float * int (CEL does not mix int and double: write "
     "100.0 or double(x))"),
    ("args.to.endsWith('x')", {"to": 3}, "'endsWith' does not apply to these values (wrong type?)"),
    ("args.n", {"n": 3}, "condition gave 3 (int), not true or false"),
    ("size(args) > 0", {"s": {1, 2}}, "a value is a set, which CEL cannot use"),
])
def test_evaluation_errors_are_one_readable_line(source: str, args: dict[str, Any], message: str) -> None:
    """Run-time failures become EvaluationError with an actionable message."""
    with pytest.raises(EvaluationError) as caught:
        compile_condition(source).evaluate({"args": args})
    assert str(caught.value) == message


@pytest.mark.parametrize(("source", "needs"), [
    ("args.to.endsWith('@x')", {"args": frozenset({"to"})}),
    ("args['to'] == 'x' && args.cc == 1", {"args": frozenset({"to", "cc"})}),
    ("'to' in args", {"args": None}),
    ("size(args) > 1 || args.size() > 1", {"args": None}),
    ("history.exists(c, c.tool == 'read_secret')", {"history": frozenset({"tool"})}),
    ("size(history) > 2 && history.exists(h, h.args.to == args.to)",
     {"history": frozenset({"args"}), "args": frozenset({"to"})}),
    ("history.filter(h, h.tool == 'x').size() > 0", {"history": None}),
    ("history.exists(h, h == null)", {"history": None}),
    ("run.labels.env == 'prod'", {"run": frozenset({"labels"})}),
    ("usage['run-calls'].calls < 3", {"usage": frozenset({"run-calls"})}),
    ("tool == 'x' && side_effect == 'read'", {"tool": None, "side_effect": None}),
])
def test_needs_are_narrow_only_when_sure(source: str, needs: dict[str, Any]) -> None:
    """The projection keeps only selected fields, and the whole value on any other use."""
    condition = compile_condition(source)
    assert needs_of(source, condition.variables) == needs
    # A condition whose history pipelines are folded per run reads them as hidden variables instead.
    plain = {k: v for k, v in condition.needs.items() if not k.startswith("__h")}
    assert plain == (needs if condition.fast is None else {k: v for k, v in plain.items() if k in needs})
    assert "history" not in plain or condition.fast is None or "history" in condition.fast_variables


def test_merge_needs_whole_value_wins() -> None:
    """Merging needs unions fields, and None (whole value) absorbs everything."""
    a = {"args": frozenset({"a"}), "history": frozenset({"tool"})}
    b = {"args": frozenset({"b"}), "history": None}
    assert merge_needs([a, b]) == {"args": frozenset({"a", "b"}), "history": None}
    assert merge_needs([b, a]) == {"args": frozenset({"a", "b"}), "history": None}


POOL = [
    "args.to.endsWith('@example.com')", "has(args.to) && args.to == 'x'", "'to' in args",
    "history.exists(h, h.tool == 'read_secret')", "history.exists(h, h.args.to == args.to)",
    "history.all(h, h.status == 'ok')", "size(history) > 1", "history.exists(h, h.missing == 1)",
    "run.labels.env == 'prod'", "run.principal == 'alice'", "usage.b.calls > 1", "args.n > 1",
    "history.map(h, h.tool).exists(t, t == 'x')",
]
values = st.one_of(st.integers(-2, 2), st.sampled_from(["x", "a@example.com", ""]), st.none())
entries = st.builds(HistoryEntry, tool=st.sampled_from(["read_secret", "x", "send"]),
                    args=st.dictionaries(st.sampled_from(["to", "n"]), values, max_size=2),
                    side_effect=st.just("read"), decision=st.just("allow"),
                    status=st.sampled_from(["ok", "failed"]))
calls = st.builds(
    Call, tool=st.just("send"),
    args=st.dictionaries(st.sampled_from(["to", "n", "cc"]), values, max_size=3),
    history=st.lists(entries, max_size=3).map(tuple),
    run=st.builds(RunInfo, principal=st.sampled_from([None, "alice"]),
                  labels=st.dictionaries(st.just("env"), st.sampled_from(["prod", "dev"]), max_size=1)),
    usage=st.dictionaries(st.just("b"), st.fixed_dictionaries({"calls": st.integers(0, 3)}), max_size=1),
)


def _outcome(source: str, activation: Any) -> object:
    try:
        return compile_condition(source).evaluate(activation)
    except EvaluationError as exc:
        return f"error: {exc}"


@settings(max_examples=examples(80), deadline=None)
@given(st.lists(st.sampled_from(POOL), min_size=1, max_size=3, unique=True), calls)
def test_projection_never_changes_a_result(sources: list[str], call: Call) -> None:
    """Evaluating with the projected variables gives exactly what the whole variables give."""
    needs = merge_needs([compile_condition(s).needs for s in sources])
    for source in sources:
        full = _outcome(source, Activation(call, "write"))
        narrowed = _outcome(source, Activation(call, "write", needs))
        assert narrowed == full, source


def test_cyclic_and_absurdly_deep_values_deny_instead_of_crashing() -> None:
    """Values that would overflow CEL's native converter (and kill the host) are refused: the call is denied."""
    from proctor.policy import Policy

    policy = Policy.from_dict({"version": 1, "default": "allow", "rules": [
        {"name": "r", "when": "size(args) > 5", "decision": "deny"},
        {"name": "h", "when": "history.exists(h, h.args.x == 1)", "decision": "deny"},
    ]})
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    deep: list[Any] = []
    for _ in range(10_000):
        deep = [deep]
    wide: list[Any] = [[]]
    for _ in range(20):
        wide = [wide, wide]  # small in memory, 2**20 lists once expanded
    for args in ({"x": cyclic}, {"x": deep}, {"x": wide}):
        decision = policy.decide(Call("t", args))
        assert decision.outcome == "deny" and decision.rules == ("r",)
        assert "condition failed: a value" in decision.reason
    history = (HistoryEntry("t", {"x": cyclic}, "read", "allow", "ok"),)
    assert policy.decide(Call("t", {}, history=history)).rules == ("h",)
    with pytest.raises(EvaluationError, match="nested deeper than 64"):
        compile_condition("size(args) > 0").evaluate({"args": {"x": cyclic}})
    assert policy.decide(Call("t", {"x": [[1]] * 10})).outcome == "allow"
