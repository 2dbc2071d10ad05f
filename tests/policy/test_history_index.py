"""History conditions read the whole run: keyed indices, the projected list and written windows agree with CEL.

The equivalence property: for random histories (mixed types, missing keys, values CEL cannot
compare, errors) and random arguments, every condition decided through the run's folds and
indices — also after the run dropped most of its raw rows — gives what CEL gives evaluating the
condition as written over the whole history, errors included.
"""

from __future__ import annotations

import math
from typing import Any

import cel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiers import examples

from proctor import Gate, Policy, tool
from proctor.calls import Call, CallRecord, HistoryEntry, RunInfo
from proctor.gate.run import RunContext
from proctor.policy.activation import Activation
from proctor.policy.aggregates import history_windows, rewrite
from proctor.policy.budgets import Ledger
from proctor.policy.conditions import EvaluationError, compile_condition
from proctor.policy.functions import FUNCTIONS

KEYED = [
    "history.exists(h, h.tool == 'x' && h.args.id == args.id)",
    "history.all(h, h.tool != 'x' || h.args.id != args.id)",
    "history.exists_one(h, h.args.id == args.id)",
    "size(history.filter(h, h.tool == 'x' && h.args.id == args.id)) >= 1",
    "history.filter(h, h.args.id == args.id && h.args.n == args.n).size() == 1",
    "history.exists(h, h.args.id == args.id && h.args.n == args.n)",
    "history.exists(h, args.id == h.args.id && h.tool == 'y')",
    "history.map(h, h.args.id).exists(v, v == args.id)",
    "history.filter(h, h.tool == 'x').exists(h, h.args.n == args.n)",
    "history.exists(h, (h.tool == 'x' && h.args.id == args.id) && h.args.n > 0)",
    "history.all(h, h.args.n > 0 || h.args.id != args.id)",
    "!history.exists(h, h.tool == 'x' && h.args.id == args.id) || args.n == 1",
    "history.exists(h, h.args.id == args.id) && history.exists(h, h.args.n == args.n)",
    "size(history.filter(h, h.args.id == args.id)) == size(history.filter(h, h.args.n == args.n))",
    "history.exists(h, h.tool == 'x' && string(h.args.id) == string(args.id))",
    "history.exists(h, h.tool == tool && h.args.n == args.n)",
]
#: Forms no index serves: the whole run's (projected) list, evaluated as written.
BARE = [
    "history.exists(h, h.args.id == args.id || h.args.n == args.n)",
    "size(history) > 0 && history[0].args.id == args.id",
    "history.exists(h, h.args.n < args.n)",
    "[1, 2].exists(i, history.exists(h, h.args.n == i))",
    "[args].exists(a, history.exists(h, h.args.id == a.id))",
]
WINDOWED = [
    "history.last(3).exists(h, h.args.id == args.id)",
    "size(last(history, 2).filter(h, h.tool == 'x')) == 2",
]
CONDITIONS = KEYED + BARE + WINDOWED

_SCALARS = st.one_of(
    st.sampled_from(["a", "b", "", "A"]), st.integers(-2, 3), st.sampled_from([1.0, 1.5, -0.0, 2.0**53, 2**60]),
    st.booleans(), st.none(), st.just(math.nan),
)
_VALUES = st.one_of(_SCALARS, st.lists(st.integers(0, 2), max_size=2), st.dictionaries(st.just("k"), st.integers(0, 1)))
_MISSING = object()


@st.composite
def _args(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("id", "n"):
        value = draw(st.one_of(_VALUES, st.just(_MISSING)))
        if value is not _MISSING:
            out[key] = value
    return out


_ENTRIES = st.lists(st.tuples(st.sampled_from(["x", "y"]), _args(), st.sampled_from(["ok", "denied"])), max_size=24)


def _entries(raw: list[tuple[str, dict[str, Any], str]]) -> list[HistoryEntry]:
    return [HistoryEntry(t, a, "read", "allow" if s == "ok" else "deny", s) for t, a, s in raw]  # type: ignore[arg-type]


def _reference(source: str, history: list[HistoryEntry], args: dict[str, Any]) -> Any:
    """CEL as written over the whole history ("error" for any error)."""
    program = cel.compile(source)
    functions = {fn: FUNCTIONS[fn].callable_for(None) for fn in program.functions() if fn in FUNCTIONS}
    try:
        return program.execute(cel.Context({"history": [h.as_dict() for h in history], "args": args, "tool": "x"},
                                           functions))
    except Exception:
        return "error"


def _decided(source: str, call: Call) -> Any:
    try:
        return compile_condition(source).evaluate(Activation(call, "read"))
    except EvaluationError:
        return "error"


def _run(history: list[HistoryEntry], limit: int) -> RunContext:
    ctx = RunContext(RunInfo(), Ledger(()), history_limit=limit)
    ctx.track(Policy.from_dict({"version": 1, "rules": [
        {"name": f"r{i}", "decision": "deny", "when": c} for i, c in enumerate(CONDITIONS)]}).pipelines)
    for h in history:
        ctx.remember_entry(h, CallRecord("c", h.tool, h.args, h.side_effect, None, h.status, 0))
    return ctx


def _same(a: Any, b: Any) -> bool:
    return a == b and type(a) is type(b)


def test_the_forms_are_served_as_documented() -> None:
    """The keyed forms are indices, the bare ones the whole list, the windows the windows written."""
    for source in KEYED:
        found = rewrite(source)
        assert found is not None and all(p.keyed is not None for p in found.pipelines), source
        assert "history" not in found.source, source
    for source in BARE:
        found = rewrite(source)
        assert found is not None and "history" not in found.source, source
        assert all(p.keyed is None and p.window is None for p in found.pipelines), source
    assert history_windows(WINDOWED[0]) == (3,) and history_windows(WINDOWED[1]) == (2,)
    assert history_windows(KEYED[0]) == ()


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=_ENTRIES, args=_args(), limit=st.sampled_from([1, 2, 1000]))
def test_indexed_evaluation_equals_plain_evaluation(raw: list[tuple[str, dict[str, Any], str]],
                                                     args: dict[str, Any], limit: int) -> None:
    """Through the run's indices (rows trimmed to `limit` or not) every condition gives CEL's answer."""
    history = _entries(raw)
    ctx = _run(history, limit)
    view = ctx.history_view()
    for source in CONDITIONS:
        expected = _reference(source, history, args)
        folded = _decided(source, Call("x", args, "read", history=view))
        assert _same(folded, expected), (source, folded, expected)
        listed = _decided(source, Call("x", args, "read", history=history))
        assert _same(listed, expected), (source, "list", listed, expected)


def test_a_long_plain_list_is_folded_and_agrees() -> None:
    """A history given as a long list (explain, policy tests) is folded on the spot, with the same answers."""
    history = _entries([("x", {"id": i % 37, "n": i}, "ok") for i in range(200)])
    for args in ({"id": 5, "n": 5}, {"id": 99, "n": 1}, {"n": 3}, {"id": [1], "n": 2}):
        for source in CONDITIONS:
            expected = _reference(source, history, args)
            assert _same(_decided(source, Call("x", args, "read", history=history)), expected), (source, args)


@tool(side_effect="read")
def read(id: str) -> str:
    """Read.

    Args:
        id: An id.
    """
    return "ok"


@tool(side_effect="external")
def refund(order_id: str) -> str:
    """Refund.

    Args:
        order_id: The order.
    """
    return "refunded"


def test_never_twice_holds_past_the_history_limit() -> None:
    """An id refunded at call #5 is refused again at call #2,600 with a history limit of 1,000 (was: allowed)."""
    policy = Policy.from_dict({"version": 1, "rules": [
        {"name": "reads", "match": {"side_effect": "read"}, "decision": "allow"},
        {"name": "refunds", "match": {"tool": "refund"}, "decision": "allow"},
        {"name": "no-refund-twice", "match": {"tool": "refund"}, "decision": "deny",
         "when": "history.exists(h, h.tool == 'refund' && h.status == 'ok' && h.args.order_id == args.order_id)"},
    ]})
    gate = Gate(policy, tools=[read, refund], history_limit=1000)
    ctx = gate.start_run()
    for i in range(4):
        gate.call("read", {"id": str(i)}, context=ctx)
    assert gate.call("refund", {"order_id": "A-1"}, context=ctx) == "refunded"
    for i in range(2_600):
        gate.call("read", {"id": str(i)}, context=ctx)
    assert len(ctx.history_view()) < 2_100  # the raw rows were trimmed ...
    from proctor.errors import ToolDenied

    with pytest.raises(ToolDenied, match="no-refund-twice"):  # ... and the index still saw call #5
        gate.call("refund", {"order_id": "A-1"}, context=ctx)
    assert gate.call("refund", {"order_id": "A-2"}, context=ctx) == "refunded"


def test_a_macro_named_history_fails_closed_once_rows_were_dropped() -> None:
    """The one read proctor cannot rewrite (a macro variable called `history`) denies rather than see a window."""
    source = "history.size() > 0 && [1].exists(history, history == 1) && size(history) > 3"
    assert rewrite(source) is None
    ctx = _run(_entries([("x", {"id": 1}, "ok")] * 10), limit=2)
    with pytest.raises(EvaluationError, match="dropped"):
        compile_condition(source).evaluate(Activation(Call("t", {}, "read", history=ctx.history_view()), "read"))
