"""The budget ledger: limits, scoping, settle/release, steps, model usage and concurrency."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from proctor.errors import BudgetExceeded
from proctor.policy import Ledger, Policy


class Clock:
    """A hand-driven monotonic clock in nanoseconds."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def ledger(budgets: list[dict[str, Any]], clock: Clock | None = None) -> Ledger:
    policy = Policy.from_dict({"version": 1, "budgets": budgets})
    return Ledger(policy.budgets, clock=clock) if clock else policy.new_ledger()


def test_call_limit_refuses_the_call_after_the_last() -> None:
    """With calls: 2 the third reservation is refused, naming tool and budget."""
    led = ledger([{"name": "two", "limit": {"calls": 2}}])
    led.reserve("t", "read", 0)
    led.reserve("t", "read", 0)
    with pytest.raises(BudgetExceeded) as caught:
        led.reserve("t", "read", 0)
    assert caught.value.budget == "two" and caught.value.tool == "t"
    assert str(caught.value) == "t: budget 'two' exhausted: 2 of 2 calls used"


def test_cost_limit_counts_declared_cost_at_reserve() -> None:
    """A call whose cost would pass the limit is refused before it runs."""
    led = ledger([{"name": "money", "limit": {"cost": 20}}])
    led.reserve("charge", "destructive", 10)
    led.reserve("charge", "destructive", 10)
    with pytest.raises(BudgetExceeded, match="cost 20 used \\+ 1 would pass the limit of 20"):
        led.reserve("charge", "destructive", 1)
    led.reserve("free", "read", 0)


def test_scoping_by_tool_glob_and_class() -> None:
    """Only calls the budget's match selects count against it."""
    led = ledger([
        {"name": "charges", "match": {"tool": "charge_*"}, "limit": {"calls": 1}},
        {"name": "outbound", "match": {"side_effect": ["external", "destructive"]}, "limit": {"calls": 2}},
    ])
    led.reserve("charge_card", "destructive", 0)
    with pytest.raises(BudgetExceeded) as caught:
        led.reserve("charge_bank", "destructive", 0)
    assert caught.value.budget == "charges"
    led.reserve("get", "read", 0)
    led.reserve("mail", "external", 0)
    with pytest.raises(BudgetExceeded, match="outbound"):
        led.reserve("mail", "external", 0)
    assert led.usage()["charges"]["calls"] == 1 and led.usage()["outbound"]["calls"] == 2


def test_a_refused_reservation_counts_nothing() -> None:
    """When one budget refuses, no other budget is charged for the call."""
    led = ledger([{"name": "all", "limit": {"calls": 10}},
                  {"name": "one", "match": {"tool": "x"}, "limit": {"calls": 0}}])
    with pytest.raises(BudgetExceeded):
        led.reserve("x", "read", 0)
    assert led.usage()["all"]["calls"] == 0


def test_release_gives_back_calls_and_cost() -> None:
    """A released reservation no longer counts; a second release is ignored."""
    led = ledger([{"name": "b", "limit": {"calls": 1, "cost": 5}}])
    r = led.reserve("t", "write", 5)
    led.release(r)
    led.release(r)
    assert led.usage()["b"]["calls"] == 0 and led.usage()["b"]["cost"] == 0
    led.reserve("t", "write", 5)


def test_settle_replaces_cost_and_adds_duration() -> None:
    """settle: the actual cost replaces the reserved one; scoped wall time sums durations."""
    led = ledger([{"name": "b", "match": {"tool": "t"}, "limit": {"cost": 10, "wall_time": "2s"}}])
    r = led.reserve("t", "write", 8)
    led.settle(r, duration_ns=1_500_000_000, cost=2)
    led.settle(r, duration_ns=10**12, cost=100)  # settled once; ignored
    assert led.usage()["b"]["cost"] == 2
    assert led.usage()["b"]["wall_time_ms"] == 1500
    assert led.remaining()["b"] == {"cost": 8, "wall_time_ms": 500}
    r2 = led.reserve("t", "write", 1)
    led.settle(r2, duration_ns=600_000_000)
    with pytest.raises(BudgetExceeded, match=r"wall time 2\.1s of 2s used"):
        led.reserve("t", "write", 0)


def test_run_wall_time_is_elapsed_since_the_run_started() -> None:
    """An unscoped wall_time counts time since the ledger was created."""
    clock = Clock()
    led = ledger([{"name": "clock", "limit": {"wall_time": "1m"}}], clock)
    led.reserve("t", "read", 0)
    clock.now = 59 * 10**9
    assert led.usage()["clock"]["wall_time_ms"] == 59_000
    led.reserve("t", "read", 0)
    clock.now = 60 * 10**9
    with pytest.raises(BudgetExceeded, match=r"wall time 60\.0s of 60s used"):
        led.reserve("t", "read", 0)
    assert led.remaining()["clock"] == {"wall_time_ms": 0}


def test_per_step_budgets_reset_on_next_step() -> None:
    """per: step budgets start afresh each step; per-run budgets keep counting."""
    clock = Clock()
    led = ledger([{"name": "step", "limit": {"calls": 1, "wall_time": "10s"}, "per": "step"},
                  {"name": "run", "limit": {"calls": 5}}], clock)
    old = led.reserve("t", "read", 0)
    with pytest.raises(BudgetExceeded, match="exhausted this step"):
        led.reserve("t", "read", 0)
    clock.now = 9 * 10**9
    led.next_step()
    clock.now = 18 * 10**9
    led.reserve("t", "read", 0)
    led.release(old)  # from the earlier step: touches the run budget only
    assert led.usage()["step"]["calls"] == 1 and led.usage()["run"]["calls"] == 1
    assert led.usage()["step"]["wall_time_ms"] == 9000


def test_model_limits() -> None:
    """charge_model accumulates; check_model raises once a model limit is reached."""
    led = ledger([{"name": "model", "limit": {"model_tokens": 1000, "model_cost_usd": 0.5}}])
    led.charge_model(400, 0.1)
    led.check_model()
    led.charge_model(600, 0.1)
    with pytest.raises(BudgetExceeded, match="1000 of 1000 model tokens used") as caught:
        led.check_model()
    assert caught.value.budget == "model"
    led2 = ledger([{"name": "usd", "limit": {"model_cost_usd": 0.5}}])
    led2.charge_model(10, 0.6)
    with pytest.raises(BudgetExceeded, match="model cost"):
        led2.check_model()
    assert led2.remaining()["usd"] == {"model_cost_usd": 0.0}


def test_usage_and_remaining_shapes() -> None:
    """usage lists every counter; remaining only the limits set."""
    led = ledger([{"name": "b", "limit": {"calls": 3}}])
    led.reserve("t", "read", 2)
    assert led.usage() == {"b": {"calls": 1, "cost": 2, "wall_time_ms": 0, "model_tokens": 0, "model_cost_usd": 0.0}}
    assert led.remaining() == {"b": {"calls": 2}}


def test_no_budgets_never_refuses() -> None:
    """A policy without budgets reserves freely."""
    led = ledger([])
    for _ in range(100):
        led.settle(led.reserve("t", "destructive", 1000), duration_ns=1)
    assert led.usage() == {} and led.remaining() == {}


def test_concurrent_reservations_never_overshoot() -> None:
    """Many threads hammering one budget get exactly `calls` reservations, never more."""
    led = ledger([{"name": "b", "match": {"tool": "t"}, "limit": {"calls": 100, "cost": 150}}])
    granted: list[int] = []
    refused: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(16)

    def hammer() -> None:
        start.wait()
        for _ in range(50):
            try:
                r = led.reserve("t", "write", 2 if _ % 2 else 1)
            except BudgetExceeded:
                with lock:
                    refused.append(1)
                continue
            with lock:
                granted.append(int(r.cost))

    threads = [threading.Thread(target=hammer) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    usage = led.usage()["b"]
    assert usage["calls"] == len(granted) <= 100
    assert usage["cost"] == sum(granted) <= 150
    assert len(granted) + len(refused) == 16 * 50


def test_a_call_no_budget_counts_leaves_nothing_open() -> None:
    """A call matched by no budget gets a reservation that holds nothing, and settling or releasing it is a no-op."""
    book = ledger([{"name": "mail", "match": {"tool": ["send_email"]}, "limit": {"calls": 1}}])
    for _ in range(3):
        r = book.reserve("lookup", "read", 5)
        assert r.budgets == ()
        book.settle(r, duration_ns=10**9)
        book.release(r)
    assert book._open == {}
    assert book.usage()["mail"] == {"calls": 0, "cost": 0, "wall_time_ms": 0, "model_tokens": 0,
                                    "model_cost_usd": 0.0}
    book.settle(book.reserve("send_email", "external", 0), duration_ns=1)
    with pytest.raises(BudgetExceeded):
        book.reserve("send_email", "external", 0)
