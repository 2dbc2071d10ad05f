"""Tests for history aggregates folded per run: same answers as CEL over the whole history, at any length."""

from __future__ import annotations

import random
from typing import Any

import cel
import pytest
from tiers import examples

from proctor.calls import Call, CallRecord, HistoryEntry, RunInfo
from proctor.gate.run import RunContext
from proctor.policy import Policy
from proctor.policy.aggregates import AggregateError, fold_list, rewrite
from proctor.policy.conditions import EvaluationError, compile_condition
from proctor.policy.functions import FUNCTIONS, cel_sum

CONDITIONS = [
    "history.exists(h, h.tool == 'read_secret')",
    "!history.exists(h, h.tool == 'read_secret')",
    "history.all(h, h.status == 'ok')",
    "history.exists_one(h, h.tool == 'read_secret')",
    "size(history.filter(h, h.tool == 'send')) >= 3",
    "history.filter(h, h.tool == 'send').size() < 2",
    "size(history) > 4",
    "history.size() == 0 || history.exists(h, h.decision == 'deny')",
    "history.exists(h, h.args.amount > 50)",
    "history.map(h, h.tool).exists(t, t == 'send')",
    "'send' in history.map(h, h.tool)",
    "history.filter(h, h.tool == 'send').exists(h, h.args.to.endsWith('@evil.com'))",
    "history.exists(h, h.args.to == args.to)",
    "history.map(h, h.tool == 'send', h.args.amount).exists(a, a > 10)",
    "true || history.exists(h, h.args.amount > 50)",
    "history.exists(h, h.args.amount > 50) || args.to == 'x@example.com'",
    "history.all(h, h.args.amount < 1000) && size(history) < 100",
    "sum(history.filter(h, h.tool == 'pay').map(h, h.args.amount)) > 100",
    "history.filter(h, h.tool in ['pay', 'send']).map(h, h.args.amount).sum() + args.amount > 150",
    "history.exists(h, normalize(h.tool) == 'send')",
    "size(history.filter(h, email_domain(h.args.to) == 'evil.com')) > 2",
]


def _history(rng: random.Random, n: int, *, errors: bool) -> list[HistoryEntry]:
    out = []
    for _ in range(n):
        tool = rng.choice(["read", "send", "read_secret", "pay"])
        args: dict[str, Any] = {}
        if tool in ("send", "pay"):
            args = {"to": rng.choice(["a@example.com", "b@evil.com"]), "amount": rng.randint(0, 100)}
            if errors and rng.random() < 0.1:
                args["amount"] = "lots"  # `> 50` on a string is a CEL error
        out.append(HistoryEntry(tool, args, "read", rng.choice(["allow", "deny"]), rng.choice(["ok", "ok", "denied"])))
    return out


def _reference(source: str, history: list[HistoryEntry], args: dict[str, Any]) -> Any:
    program = cel.compile(source)
    functions = {fn: FUNCTIONS[fn].callable_for(None) for fn in program.functions() if fn in FUNCTIONS}
    try:
        return program.execute(cel.Context({"history": [h.as_dict() for h in history], "args": args}, functions))
    except Exception:
        return "error"


def _decided(source: str, call: Call) -> Any:
    try:
        return compile_condition(source).evaluate(_activation(call))
    except EvaluationError:
        return "error"


def _activation(call: Call) -> Any:
    from proctor.policy.activation import Activation

    return Activation(call, "read")


def _run_with(history: list[HistoryEntry], limit: int) -> RunContext:
    from proctor.policy.budgets import Ledger

    ctx = RunContext(RunInfo(), Ledger(()), history_limit=limit)
    ctx.track(Policy.from_dict({"version": 1, "rules": [
        {"name": f"r{i}", "decision": "deny", "when": c} for i, c in enumerate(CONDITIONS)]}).pipelines)
    for h in history:
        ctx.remember_entry(h, CallRecord("c", h.tool, h.args, h.side_effect, None, h.status, 0))
    return ctx


@pytest.mark.parametrize("errors", [False, True])
def test_folded_conditions_agree_with_cel_over_the_whole_history(errors: bool) -> None:
    """Every condition gives CEL's answer (errors included) from a plain list and from a trimmed run."""
    rng = random.Random(7 + errors)
    for trial in range(examples(40)):  # random trials, as many as a property test's examples
        history = _history(rng, rng.choice([rng.randint(0, 30), 70]), errors=errors)  # long lists are folded
        args = {"to": rng.choice(["a@example.com", "b@evil.com"]), "amount": 5}
        ctx = _run_with(history, limit=3)  # most entries dropped: folds must still see them all
        for source in CONDITIONS:
            expected = _reference(source, history, args)
            listed = _decided(source, Call("send", args, "read", history=history))
            assert listed == expected, (trial, source, "list")
            folded = _decided(source, Call("send", args, "read", history=ctx.history_view()))
            assert folded == expected, (trial, source, "run")


def test_every_read_of_history_is_rewritten() -> None:
    """Entry-local pipelines are folds, ones comparing the entry with the call keyed indices, any other read
    the run's whole list: no condition reads a window it did not write (a macro naming its variable
    `history` is left as written, and fails closed once entries were dropped)."""
    assert rewrite("history.exists(h, h.tool == 'x')") is not None
    assert rewrite("size(history.filter(h, h.tool == 'x')) > 2") is not None
    keyed = rewrite("history.exists(h, h.args.to == args.to)")
    assert keyed is not None and keyed.source == keyed.pipelines[0].name
    assert keyed.pipelines[0].keyed is not None and keyed.pipelines[0].free_sources == ("args.to",)
    assert rewrite("history.exists(c, c.tool == tool)") is not None
    bare = rewrite("history[0].tool == 'x'")
    assert bare is not None and bare.pipelines[0].keyed is None and bare.pipelines[0].window is None
    assert rewrite("[1].exists(history, history > 0)") is None
    mixed = rewrite("size(history) > 2 && history.exists(h, h.args.to == args.to)")
    assert mixed is not None and "history" not in mixed.source


def test_sum_fold_gives_cel_sum_of_the_whole_list() -> None:
    """sum() folded one entry at a time equals `cel_sum` of the list: int or double, errors on bools and overflow."""
    found = rewrite("history.map(h, h.args.amount).sum() > 0")
    assert found is not None
    (pipeline,) = found.pipelines
    for amounts in ([1, 2, 2.5, 4], [], [3, 4], [2**53, 1, 0.5], [0.1] * 10):
        entries = [{"args": {"amount": v}} for v in amounts]
        assert fold_list(pipeline, entries).value() == cel_sum(amounts)
    for bad in ([True], [2**62, 2**62]):
        with pytest.raises(AggregateError):
            fold_list(pipeline, [{"args": {"amount": v}} for v in bad]).value()


def test_trimmed_run_keeps_the_window_and_counts_every_call() -> None:
    """A run past its history limit keeps a bounded window of entries and records, and counts every call."""
    ctx = _run_with(_history(random.Random(1), 2_500, errors=False), limit=100)
    assert ctx.calls_made == 2_500 and len(ctx.records) == 2_500
    assert 100 <= len(ctx.history_view()) < 200 and 100 <= len(list(ctx.records)) < 200
    assert sum(ctx.status_counts.values()) == 2_500
    assert len(ctx.records[2_450:]) == 50
    size = compile_condition("size(history) == 2500")
    assert size.evaluate(_activation(Call("x", {}, "read", history=ctx.history_view())))


def test_a_pipeline_first_seen_after_entries_were_dropped_denies() -> None:
    """A fold that starts after entries were dropped cannot answer exactly, so its condition fails closed."""
    ctx = _run_with(_history(random.Random(2), 50, errors=False), limit=5)
    late = compile_condition("history.exists(h, h.status == 'timeout')")
    with pytest.raises(EvaluationError, match="dropped"):
        late.evaluate(_activation(Call("x", {}, "read", history=ctx.history_view())))
