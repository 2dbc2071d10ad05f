"""RedisLedger against a real redis-server: the conformance suite, gates, failure and fleet load."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_engines import RedisServer
from ledger_conformance import LeaseConformance, LedgerConformance, MakeLedger

from proctor import Gate, Policy, tool
from proctor.errors import BudgetExceeded, LedgerUnavailable
from proctor.halt import gate_halts
from proctor.ledger import SharedLedger, open_ledger
from proctor.ledger.redis import RedisLedger

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(Path(__file__).with_name("fleet_worker.py"))


@pytest.fixture
def make_ledger(redis_server: RedisServer) -> Iterator[MakeLedger]:
    """RedisLedgers on one fresh server; closed after the test."""
    made: list[RedisLedger] = []

    def make(lease_s: float) -> SharedLedger:
        led = RedisLedger(redis_server.url, lease_s=lease_s)
        made.append(led)
        return led

    yield make
    for led in made:
        led.close()


class TestRedisLedger(LedgerConformance, LeaseConformance):
    """RedisLedger keeps every promise of the protocol, leases included."""


def _policy(limit: int = 1000) -> Policy:
    return Policy.from_dict({"version": 1, "default": "allow",
                             "budgets": [{"name": "g", "per": "global", "limit": {"calls": limit}}]})


@tool(side_effect="write")
def ping() -> str:
    """Ping."""
    return "pong"


def test_gate_takes_a_redis_url_and_two_gates_share_the_pool(redis_server: RedisServer) -> None:
    """Gate(policy, ledger=URL): two gates on one Redis draw on one global pool."""
    g1 = Gate(_policy(3), tools=[ping], ledger=redis_server.url)
    g2 = Gate(_policy(3), tools=[ping], ledger=redis_server.url)
    try:
        assert isinstance(g1.ledger, RedisLedger)
        assert [g1.call("ping"), g2.call("ping"), g1.call("ping")] == ["pong"] * 3
        with pytest.raises(BudgetExceeded, match="budget 'g' exhausted for all runs: 3 of 3 calls used"):
            g2.call("ping")
        assert g2.default_context().ledger.usage()["g"]["calls"] == 3
    finally:
        g1.ledger.close()
        g2.ledger.close()


def test_a_gate_on_redis_starts_a_global_budget_and_states_no_local_ledger(redis_server: RedisServer) -> None:
    """A cross-run budget on a shared ledger: the gate starts (no `ledger: local` needed), its run_started record
    carries no local-ledger statement, and the summary names the shared ledger."""
    from proctor.testing import InMemoryAudit

    audit = InMemoryAudit()
    gate = Gate(_policy(3), tools=[ping], ledger=redis_server.url, audit=audit)
    try:
        gate.finish_run(gate.start_run())
        (started,) = audit.of_kind("run_started")
        assert "ledger" not in started and not gate.ledger_scope.local
        assert gate.ledger_scope.summary == f"{gate.ledger.url} (shared): g (per global)"
    finally:
        gate.ledger.close()


def test_PROCTOR_LEDGER_names_the_default(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a ledger argument the gate uses PROCTOR_LEDGER."""
    monkeypatch.setenv("PROCTOR_LEDGER", redis_server.url)
    led = open_ledger()
    try:
        assert isinstance(led, RedisLedger) and led.ping()
    finally:
        led.close()


def test_unreachable_redis_refuses_the_call_and_the_next_call_retries(tmp_path: Path) -> None:
    """With Redis down the call is refused (LedgerUnavailable, the tool not run); once it is up, calls go on."""
    server = RedisServer(tmp_path)
    runs: list[int] = []

    @tool(side_effect="write")
    def effect() -> int:
        """Do something."""
        runs.append(1)
        return len(runs)

    # The ledger's own refusal: this gate honours only its process's halts (a gate on this Redis reads its
    # halts too by default, and refuses while they cannot be read: tests/ops/test_halt.py).
    gate = Gate(_policy(), tools=[effect], ledger=server.url + "&timeout=500ms", halts=gate_halts)
    try:
        with pytest.raises(LedgerUnavailable, match="is unreachable or too slow"):
            gate.call("effect")
        assert runs == []
        server.start()
        assert gate.call("effect") == 1
    finally:
        gate.ledger.close()
        server.stop()


def test_a_redis_slower_than_the_timeout_refuses_the_call(redis_server: RedisServer) -> None:
    """While Redis holds every write (CLIENT PAUSE), a call waits at most `timeout` and is refused, tool not run."""
    import redis as redis_py

    runs: list[int] = []

    @tool(side_effect="write")
    def effect() -> int:
        """Do something."""
        runs.append(1)
        return len(runs)

    gate = Gate(_policy(), tools=[effect], ledger=redis_server.url + "&timeout=300ms")
    admin = redis_py.Redis.from_url(redis_server.url)
    try:
        assert gate.call("effect") == 1
        admin.execute_command("CLIENT", "PAUSE", "3000", "WRITE")
        began = time.monotonic()
        with pytest.raises(LedgerUnavailable, match="unreachable or too slow"):
            gate.call("effect")
        assert time.monotonic() - began < 2.5 and runs == [1]
        admin.execute_command("CLIENT", "UNPAUSE")
        assert gate.call("effect") == 2
    finally:
        admin.close()
        gate.ledger.close()


def _workers(url: str, counter: Path, n: int, calls: int, **env: str) -> list[subprocess.Popen[str]]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return [subprocess.Popen([sys.executable, WORKER, url, str(counter), str(calls)],
                             cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(n)]


def _results(procs: list[subprocess.Popen[str]]) -> list[dict[str, int]]:
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        assert p.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_sixteen_processes_share_a_global_budget_exactly(redis_server: RedisServer, tmp_path: Path) -> None:
    """16 processes x 200 calls against a global budget of 1,000: exactly 1,000 run, the others are refused."""
    counter = tmp_path / "ran"
    results = _results(_workers(redis_server.url, counter, 16, 200))
    assert sum(r["ran"] for r in results) == 1000
    assert sum(r["refused"] for r in results) == 16 * 200 - 1000
    assert counter.stat().st_size == 1000
    led = RedisLedger(redis_server.url)
    try:
        pools = led.usage(["fleet-global|global|w=0"])
        assert pools["fleet-global|global|w=0"].calls == 1000
    finally:
        led.close()


def test_killed_holders_give_their_reservations_back(redis_server: RedisServer, tmp_path: Path) -> None:
    """SIGKILLed processes holding reservations lose them when their leases expire; nothing overshoots."""
    counter, hold = tmp_path / "ran", tmp_path / "holders"
    url = redis_server.url + "&lease=1s"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holders = [subprocess.Popen([sys.executable, WORKER, url, str(counter), "1", str(hold)],
                                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _ in range(2)]
    deadline = time.monotonic() + 120
    while not hold.exists() or len(hold.read_text().split()) < 2:
        assert time.monotonic() < deadline, "the holders never reached their tool"
        time.sleep(0.1)
    led = RedisLedger(redis_server.url)
    try:
        assert led.usage(["fleet-global|global|w=0"])["fleet-global|global|w=0"].calls == 2
        for p in holders:
            p.send_signal(signal.SIGKILL)
            p.wait()
        # The workers keep calling until the 1000th call ran (or 120 s): the dead reservations come back only
        # when their 1 s leases expire, and 2 x 600 calls on a fast machine were all refused before that (998).
        stop = tmp_path / "stop"
        procs = _workers(url, counter, 2, 1_000_000, FLEET_PACE_S="0.002", FLEET_STOP_FILE=str(stop))
        try:
            _wait_for(lambda: _size(counter) >= 1000, "the dead holders' reservations never came back")
        finally:
            stop.touch()
        results = _results(procs)
        assert sum(r["ran"] for r in results) == 1000  # the 2 dead reservations came back
        assert counter.stat().st_size == 1000
        assert led.usage(["fleet-global|global|w=0"])["fleet-global|global|w=0"].calls == 1000
    finally:
        led.close()


def _wait_for(predicate: object, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def test_redis_restarted_mid_run_refuses_while_down_then_goes_on(redis_server: RedisServer, tmp_path: Path) -> None:
    """Calls are refused while Redis is down and run after its restart; the count survives, never overshooting."""
    counter, stop = tmp_path / "ran", tmp_path / "stop"
    procs = _workers(redis_server.url + "&timeout=300ms&lease=1s", counter, 2, 5000, FLEET_PACE_S="0.01",
                     FLEET_STOP_FILE=str(stop))
    try:
        _wait_for(lambda: _size(counter) >= 20, "no call ran before the restart")
        redis_server.stop()
        time.sleep(1.5)  # calls reserved just before the stop finish
        before = _size(counter)
        time.sleep(0.5)
        assert _size(counter) == before, "a call ran while the ledger was down"
        redis_server.start()
        _wait_for(lambda: _size(counter) >= before + 20, "calls did not go on after the restart")
    finally:
        stop.touch()
    results = _results(procs)
    ran = sum(r["ran"] for r in results)
    assert sum(r["unavailable"] for r in results) > 0, results
    assert _size(counter) == ran <= 1000, results
    led = RedisLedger(redis_server.url)
    try:
        # A reserve whose answer was lost (a timeout) holds a lease nobody renews: it runs out within 1s.
        _wait_for(lambda: led.usage(["fleet-global|global|w=0"])["fleet-global|global|w=0"].calls == ran,
                  "the pool does not settle at the calls that ran", 30)
    finally:
        led.close()


def test_a_settle_whose_reply_is_lost_is_sent_again(redis_server: RedisServer) -> None:
    """A settle written just before Redis went away (its reply never read) is sent again once Redis is back."""
    from proctor.ledger import Claim

    claim = Claim(key="s|global|w=0", budget="s", calls=10, scope="for all runs")
    led = RedisLedger(redis_server.url, lease_s=1.5, timeout_s=0.5)
    try:
        led.settle(led.reserve([claim], 0), duration_ns=1)  # the first settle waits for its reply
        lease = led.reserve([claim], 0)
        redis_server.stop()
        led.settle(lease, duration_ns=10)  # written (or not) into a connection whose server is gone
        redis_server.start()
        _wait_for(lambda: led.usage([claim.key])[claim.key].wall_ns == 11, "the lost settle was never sent again", 30)
        assert led.usage([claim.key])[claim.key].calls == 2
    finally:
        led.close()


def test_a_settle_answered_with_an_error_is_sent_again(redis_server: RedisServer) -> None:
    """A settle Redis refuses (its script cache flushed: NOSCRIPT) is sent again, whole, by the keeper."""
    import redis as redis_py

    from proctor.ledger import Claim

    claim = Claim(key="e|global|w=0", budget="e", calls=10, scope="for all runs")
    led = RedisLedger(redis_server.url, lease_s=1.5)
    admin = redis_py.Redis.from_url(redis_server.url)
    try:
        led.settle(led.reserve([claim], 0), duration_ns=1)
        lease = led.reserve([claim], 0)
        admin.script_flush()
        led.settle(lease, duration_ns=10)  # EVALSHA of a script Redis no longer has
        _wait_for(lambda: led.usage([claim.key])[claim.key].wall_ns == 11, "the refused settle was not sent again", 30)
        assert led.usage([claim.key])[claim.key].calls == 2
    finally:
        admin.close()
        led.close()
