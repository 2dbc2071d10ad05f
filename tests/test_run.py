"""Tests for proctor.gate.run: the run context's history view, lazy usage and grants."""

from __future__ import annotations

from typing import Any

import pytest

from proctor.approval import Grant
from proctor.calls import CallRecord, HistoryEntry, RunInfo
from proctor.gate.run import LazyUsage, RunContext
from proctor.policy import Policy


def _context() -> RunContext:
    policy = Policy.from_dict({"version": 1, "budgets": [{"name": "all", "limit": {"calls": 3}}]})
    return RunContext(RunInfo(id="run_t"), policy.new_ledger())


def _remember(ctx: RunContext, tool: str) -> None:
    entry = HistoryEntry(tool, {}, "read", "allow", "ok")
    ctx.remember_entry(entry, CallRecord("c", tool, {}, "read", None, "ok", 0))


def test_history_view_is_a_snapshot() -> None:
    """A view taken before a call does not see that call; a new view does."""
    ctx = _context()
    _remember(ctx, "a")
    view = ctx.history_view()
    _remember(ctx, "b")
    assert [e.tool for e in view] == ["a"] and len(view) == 1
    assert [e.tool for e in ctx.history_view()] == ["a", "b"]
    assert view[-1].tool == "a" and view[:5][0].tool == "a"
    with pytest.raises(IndexError):
        view[1]


def test_next_step_counts_steps() -> None:
    """Each step bumps run.step."""
    ctx = _context()
    assert ctx.next_step() == 1 and ctx.next_step() == 2 and ctx.info.step == 2


def test_lazy_usage_reads_the_ledger_once_and_only_when_read() -> None:
    """Usage is read from the ledger on first access, then cached."""
    reads: list[int] = []

    class Ledger:
        def usage(self) -> dict[str, Any]:
            reads.append(1)
            return {"all": {"calls": 1}}

    usage = LazyUsage(Ledger())  # type: ignore[arg-type]
    assert reads == []
    assert usage["all"] == {"calls": 1} and list(usage) == ["all"] and len(usage) == 1
    assert reads == [1]


def test_grants_match_tool_and_argument_globs() -> None:
    """A grant covers its tool, and only arguments whose text matches each glob."""
    ctx = _context()
    ctx.grants.append(Grant("send", {"to": "*@example.com"}))
    assert ctx.granted("send", {"to": "a@example.com"}) is not None
    assert ctx.granted("send", {"to": "a@other.org"}) is None
    assert ctx.granted("send", {}) is None
    assert ctx.granted("wipe", {"to": "a@example.com"}) is None
