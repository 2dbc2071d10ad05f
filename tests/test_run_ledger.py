"""The run's budget ledger seam (`proctor.gate.run.Ledger`): every implementation keeps every promise it names.

The gate, the journal (replayed calls) and durable runs (snapshot, restore) call these methods
directly, so a ledger that lacks one fails here rather than being skipped at run time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from proctor.calls import RunInfo
from proctor.errors import BudgetExceeded
from proctor.gate.budgets import FollowingLedger
from proctor.gate.run import Ledger
from proctor.ledger.memory import MemoryLedger
from proctor.narrowing import StackedLedger
from proctor.policy import Policy

POLICY = {
    "version": 1,
    "budgets": [
        {"name": "run-calls", "limit": {"calls": 2}},
        {"name": "per-alice", "per": "principal", "limit": {"calls": 100}},
        {"name": "tokens", "limit": {"model_tokens": 10}},
    ],
}
RUN = RunInfo(id="run_ledger_seam", principal="alice")

Factory = Callable[[MemoryLedger], Ledger]


def _plain(shared: MemoryLedger) -> Ledger:
    return Policy.from_dict(POLICY).new_ledger(RUN, shared)


def _stacked(shared: MemoryLedger) -> Ledger:
    own = Policy.from_dict({"version": 1, "budgets": [{"name": "own-calls", "limit": {"calls": 2}}]})
    return StackedLedger(_plain(shared), own.new_ledger(RUN, shared), agent="helper")


def _following(shared: MemoryLedger) -> Ledger:
    return FollowingLedger(Policy.from_dict(POLICY), RUN, shared)


def _followed(shared: MemoryLedger) -> Ledger:
    """A following ledger that has followed a change already (a policy with another budget, then back)."""
    ledger = FollowingLedger(Policy.from_dict(POLICY), RUN, shared)
    ledger.follow(Policy.from_dict({**POLICY, "budgets": [*POLICY["budgets"], {"name": "x", "limit": {"calls": 9}}]}))
    ledger.follow(Policy.from_dict(POLICY))
    return ledger


LEDGERS = [pytest.param(_plain, id="budgets.Ledger"), pytest.param(_stacked, id="StackedLedger"),
           pytest.param(_following, id="FollowingLedger"), pytest.param(_followed, id="FollowingLedger-followed")]


def _protocol_members() -> list[str]:
    return sorted(n for n, v in vars(Ledger).items() if not n.startswith("_") and callable(v))


def _run_once(ledger: Ledger) -> None:
    ledger.settle(ledger.reserve("lookup", "read", 1), duration_ns=1000)


def test_the_protocol_names_replay_snapshot_and_restore() -> None:
    """What the journal and durable runs call is part of the seam, not probed for."""
    assert {"replay", "snapshot", "restore", "charge_model", "check_model"} <= set(_protocol_members())


@pytest.mark.parametrize("factory", LEDGERS)
def test_every_member_is_implemented(factory: Factory) -> None:
    ledger = factory(MemoryLedger())
    missing = [name for name in _protocol_members() if not callable(getattr(ledger, name, None))]
    assert missing == [], f"{type(ledger).__name__} lacks {missing}"


@pytest.mark.parametrize("factory", LEDGERS)
def test_replay_counts_the_run_budgets_and_is_never_refused(factory: Factory) -> None:
    ledger = factory(MemoryLedger())
    _run_once(ledger)
    _run_once(ledger)
    ledger.replay("lookup", "read", 1, 5000)  # the limit is reached: a replayed call ran before, it still counts
    assert ledger.usage()["run-calls"]["calls"] == 3
    with pytest.raises(BudgetExceeded):
        ledger.reserve("lookup", "read", 1)


@pytest.mark.parametrize("factory", LEDGERS)
def test_replay_leaves_shared_pools_alone(factory: Factory) -> None:
    """A shared pool (per principal) counted the call when it ran; a resume must not count it twice."""
    ledger = factory(MemoryLedger())
    _run_once(ledger)
    ledger.replay("lookup", "read", 1, 5000)
    assert ledger.usage()["per-alice"]["calls"] == 1
    assert ledger.usage()["run-calls"]["calls"] == 2


@pytest.mark.parametrize("factory", LEDGERS)
def test_snapshot_restores_into_a_fresh_ledger(factory: Factory) -> None:
    shared = MemoryLedger()
    ledger = factory(shared)
    _run_once(ledger)
    ledger.charge_model(4, 0.0)
    saved = ledger.snapshot()
    fresh = factory(MemoryLedger())
    fresh.restore(saved)
    used, again = ledger.usage(), fresh.usage()
    for name in ("run-calls", "tokens"):
        assert again[name]["calls"] == used[name]["calls"]
        assert again[name]["model_tokens"] == used[name]["model_tokens"]
    fresh.restore({})  # an empty snapshot (a run saved without budgets) changes nothing
    assert fresh.usage()["run-calls"]["calls"] == 1


@pytest.mark.parametrize("factory", LEDGERS)
def test_model_use_is_charged_and_checked(factory: Factory) -> None:
    ledger = factory(MemoryLedger())
    ledger.check_model()
    ledger.charge_model(10, 0.0, shared=False)
    with pytest.raises(BudgetExceeded, match="tokens"):
        ledger.check_model()


def test_a_stacked_ledger_replays_into_both_past_its_deadline() -> None:
    """A managed agent's replayed call counts in the run's budgets and its own, even once its time is up."""
    shared = MemoryLedger()
    base = _plain(shared)
    own = Policy.from_dict({"version": 1, "budgets": [{"name": "own-calls", "limit": {"calls": 2}}]})
    stacked = StackedLedger(base, own.new_ledger(RUN, shared), agent="helper", deadline=time.monotonic() - 1)
    with pytest.raises(BudgetExceeded, match="time given"):
        stacked.reserve("lookup", "read", 1)
    stacked.replay("lookup", "read", 1, 0)
    used: dict[str, Any] = stacked.usage()
    assert used["run-calls"]["calls"] == 1 and used["own-calls"]["calls"] == 1
    assert base.usage()["run-calls"]["calls"] == 1


def test_a_following_ledger_carries_use_over_by_budget_name_and_settles_a_hold_where_it_was_made() -> None:
    """A reloaded policy's budgets: one it keeps carries its use over under its new limit, one it adds counts from
    the change, one it drops is gone; a call reserved before the change is given back to the ledger that held it."""
    shared = MemoryLedger()
    ledger = FollowingLedger(Policy.from_dict(POLICY), RUN, shared)
    _run_once(ledger)
    in_flight = ledger.reserve("lookup", "read", 1)
    tighter = Policy.from_dict({"version": 1, "budgets": [{"name": "run-calls", "limit": {"calls": 2}},
                                                          {"name": "new-one", "limit": {"calls": 5}}]})
    ledger.follow(tighter)
    used: dict[str, Any] = ledger.usage()
    assert used["run-calls"]["calls"] == 2 and used["new-one"]["calls"] == 0 and "tokens" not in used
    ledger.settle(in_flight, duration_ns=10)  # to the ledger that made it: no error, nothing counted twice
    assert ledger.usage()["run-calls"]["calls"] == 2
    with pytest.raises(BudgetExceeded, match="run-calls"):  # the kept budget's use, under the new limit
        ledger.reserve("lookup", "read", 1)
    with pytest.raises(TypeError, match="FollowingLedger"):
        ledger.release(_plain(shared).reserve("lookup", "read", 1))
