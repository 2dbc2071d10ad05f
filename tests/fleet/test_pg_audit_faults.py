"""Red team: the PostgreSQL audit sink under connection kills and a server crash while many calls are in flight."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fleet_engines import PostgresServer

from proctor import Gate, Policy, tool
from proctor.audit import generate_keypair
from proctor.audit.postgres import PostgresAuditLog, export_jsonl, verify_postgres
from proctor.audit.records import GENESIS, seal
from proctor.errors import ProctorError


def _exported(url: str) -> list[dict[str, object]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "audit.jsonl"
        with out.open("wb") as f:
            export_jsonl(url, f)
        return [json.loads(line) for line in out.read_text().splitlines()]


def _terminate_others(server: PostgresServer) -> int:
    """pg_terminate_backend every client backend but this one; return how many were killed."""
    with psycopg.connect(server.url, autocommit=True) as conn:
        rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()").fetchall()
    return sum(1 for (ok,) in rows if ok)


def _run_calls_through_faults(server: PostgresServer, url: str, faults: object, threads_: int
                               ) -> tuple[list[int], int]:
    """`threads_` gate threads make write calls while `faults()` runs; returns (effects, refusals)."""
    effects: list[int] = []
    lock = threading.Lock()
    counter = iter(range(1_000_000))
    stop = threading.Event()
    refused = [0]

    @tool(side_effect="write")
    def write(n: int) -> int:
        """Write.

        Args:
            n: Which call.
        """
        with lock:
            effects.append(n)
        return n

    sink = PostgresAuditLog(url, checkpoint_every=50)
    gate = Gate(Policy.from_dict({"version": 1, "default": "allow"}), audit=sink, tools=[write])

    def worker() -> None:
        ctx = gate.start_run()
        while not stop.is_set():
            with lock:
                n = next(counter)
            try:
                gate.call("write", {"n": n}, context=ctx)
            except ProctorError:
                with lock:
                    refused[0] += 1
        gate.finish_run(ctx)

    threads = [threading.Thread(target=worker) for _ in range(threads_)]
    for t in threads:
        t.start()
    try:
        faults()  # type: ignore[operator]
        # the calls go on once the database is back: wait for 40 more effects
        with lock:
            target = len(effects) + 40
        for _ in range(600):
            with lock:
                if len(effects) >= target:
                    break
            stop.wait(0.1)
        with lock:
            assert len(effects) >= target, "calls did not go on after the faults"
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
        sink.close()
    assert not any(t.is_alive() for t in threads), "a gate thread hung after the faults"
    return effects, refused[0]


def _assert_every_effect_has_its_intent(url: str, effects: list[int]) -> None:
    intents = {r["args"]["n"] for r in _exported(url) if r["kind"] == "call_intent"}  # type: ignore[index]
    missing = sorted(set(effects) - intents)
    assert not missing, f"{len(missing)} tool effects without a durable intent: {missing[:10]}"


@pytest.mark.parametrize("threads", [1, 4])  # one: each append writes its own batch; four: batched by the writers
def test_backends_killed_mid_batch_fail_every_waiting_intent_closed(threads: int) -> None:
    """pg_terminate_backend of the sink's connections while threads write: no tool runs without its intent."""
    server = PostgresServer()
    server.start()
    try:
        name = uuid.uuid4().hex[:12]
        url = f"{server.url}&log={name}"
        killed, mid_batch = [0], [0]

        def faults() -> None:
            pause = threading.Event()
            for i in range(15):
                pause.wait(0.15)
                killed[0] += _terminate_others(server)  # wherever the calls are: between batches, in one of outcomes
                if i % 5 == 4:  # and, not left to the clock, while a batch of intents is in its append
                    mid_batch[0] += _kill_one_lane_mid_batch(server, name)

        effects, refused = _run_calls_through_faults(server, url, faults, threads)
        assert killed[0] > 0 and mid_batch[0] == 3 and refused > 0, (killed, mid_batch, refused)
        _assert_every_effect_has_its_intent(url, effects)
        report = verify_postgres(url)
        assert report.ok, report.failure
    finally:
        server.cleanup()


@pytest.mark.parametrize("threads", [1, 4])
def test_a_server_crash_loses_no_intent_a_tool_ran_on(threads: int) -> None:
    """An immediate (crash) stop of PostgreSQL mid-run and a restart: every tool that ran has its intent on disk."""
    server = PostgresServer()
    server.start()
    try:
        url = f"{server.url}&log={uuid.uuid4().hex[:12]}"

        def faults() -> None:
            pause = threading.Event()
            for _ in range(2):
                pause.wait(0.5)
                server.stop()  # pg_ctl -m immediate: no checkpoint, what was not flushed is lost
                pause.wait(0.3)
                server.start()

        effects, refused = _run_calls_through_faults(server, url, faults, threads)
        assert refused > 0
        _assert_every_effect_has_its_intent(url, effects)
        report = verify_postgres(url)
        assert report.ok, report.failure
    finally:
        server.cleanup()


def _rechain(conn: psycopg.Connection[Any], log: str, forge: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
             ) -> None:
    """Rewrite a log's rows as an attacker with write access would: `forge` edits the records (each without
    h/prev/seq), then every row is re-sealed into a well-formed chain and the log's head row follows it."""
    rows = conn.execute("SELECT line FROM proctor_audit_records WHERE log = %s ORDER BY seq", (log,)).fetchall()
    records = [json.loads(line) for (line,) in rows]
    for r in records:
        for key in ("h", "prev", "seq"):
            r.pop(key)
    forged = forge(records)
    conn.execute("DELETE FROM proctor_audit_records WHERE log = %s", (log,))
    head = GENESIS
    for seq, record in enumerate(forged):
        line, h = seal({**record, "seq": seq, "prev": head})
        conn.execute("INSERT INTO proctor_audit_records (log, seq, kind, line, h) VALUES (%s, %s, %s, %s, %s)",
                     (log, seq, record["kind"], line.decode().rstrip("\n"), h))
        head = h
    conn.execute("UPDATE proctor_audit_logs SET seq = %s, head = %s WHERE name = %s", (len(forged), head, log))


@pytest.mark.parametrize("how", ["insert", "reorder", "drop_denied", "insert_without_checkpoints"])
def test_a_forged_or_reordered_row_rechained_by_hand_fails_verify_of_a_signed_log(
        tmp_path: Path, how: str) -> None:
    """A row inserted, two rows swapped or one dropped, the whole chain then rebuilt by hand: a signed log fails."""
    server = PostgresServer()
    server.start()
    try:
        name = uuid.uuid4().hex[:12]
        url = f"{server.url}&log={name}"
        key = tmp_path / "k"
        generate_keypair(key)
        with PostgresAuditLog(url, signing_key=key, checkpoint_every=10) as log:
            for i in range(12):
                assert log.append("call_intent", {"call_id": f"c{i}", "run_id": "r", "tool": "pay",
                                                  "args": {"to": "bob", "i": i}}).ok
                assert log.append("call_outcome", {"call_id": f"c{i}", "run_id": "r", "tool": "pay",
                                                   "status": "denied" if i == 3 else "ok"}).ok
        assert verify_postgres(url, pubkey=tmp_path / "k.pub").ok

        def forge(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
            if how.startswith("insert"):  # a call that never happened, early in the log
                fake = {**records[2], "call_id": "c-forged", "args": {"to": "eve", "i": 99}}
                records = [*records[:3], fake, *records[3:]]
                # the signed checkpoints no longer match: an attacker drops them (and the head row's copy)
                return [r for r in records if r["kind"] != "checkpoint"] if how.endswith("checkpoints") else records
            if how == "reorder":
                records[4], records[6] = records[6], records[4]
                return records
            return [r for r in records if r.get("status") != "denied"]

        with psycopg.connect(server.url, autocommit=True) as conn:
            _rechain(conn, name, forge)
            if how.endswith("checkpoints"):
                conn.execute("UPDATE proctor_audit_logs SET ckpt_line = NULL, last_ckpt = NULL, frontier_size = 0, "
                             "frontier = '{}' WHERE name = %s", (name,))
        report = verify_postgres(url, pubkey=tmp_path / "k.pub")
        assert not report.ok and report.failure is not None, how
    finally:
        server.cleanup()


def test_a_stalled_server_refuses_the_intent_instead_of_blocking_the_call_for_ever() -> None:
    """PostgreSQL frozen (SIGSTOP, as a paused VM or a silent partition): the call is refused, not left hanging."""
    server = PostgresServer()
    server.start()
    frozen: list[int] = []
    try:
        ran: list[int] = []

        @tool(side_effect="external")
        def send() -> int:
            """Send."""
            ran.append(1)
            return len(ran)

        sink = PostgresAuditLog(f"{server.url}&log={uuid.uuid4().hex[:12]}")
        gate = Gate(Policy.from_dict({"version": 1, "default": "allow"}), audit=sink, tools=[send])
        ctx = gate.start_run()
        assert gate.call("send", context=ctx) == 1
        postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True, check=False)
        frozen = [postmaster, *map(int, children.stdout.split())]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        out: dict[str, Any] = {}
        caller = threading.Thread(target=lambda: out.update(r=gate.submit("send", {}, context=ctx)), daemon=True)
        caller.start()
        caller.join(45)  # a hang detector, far above any sane client-side deadline
        assert not caller.is_alive(), "the call still waits for a frozen database"
        assert out["r"].record.status == "denied" and ran == [1]
    finally:
        for pid in frozen:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        server.cleanup()


def _kill_one_lane_mid_batch(server: PostgresServer, log: str) -> int:
    """Kill one of the sink's two lanes while a batch of intents is inside its append statement; return 1.

    The log's head row is held locked from a transaction of this test, so the next batches wait in the append
    function's ``FOR UPDATE`` of that row: in flight, not committed. A lane waiting there in the durable append
    (its batch holds an intent: intents are durable, outcomes are not) is terminated, and gone, before the row is
    let go, so its batch can only fail — its intents refused, their tools never run — never land; the other
    lane's batch then goes on. Nothing here depends on when the kill lands."""
    waiting = ("SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() "
               "AND wait_event_type = 'Lock' AND query LIKE 'CALL proctor_audit_append_runs_durable%' "
               "ORDER BY backend_start DESC LIMIT 1")
    for _ in range(200):
        with psycopg.connect(server.url) as conn:  # a transaction: the row stays locked until the rollback
            conn.execute("SELECT 1 FROM proctor_audit_logs WHERE name = %s FOR UPDATE", (log,))
            # Every caller may be waiting on one batch of outcomes (they wait for their outcome's record): then no
            # intent comes while the row is held. Let it through and lock again. (Well under the sink's statement
            # deadline, so the waiting batches are refused by nothing but the kill.)
            until = time.monotonic() + 0.5
            while (row := conn.execute(waiting).fetchone()) is None and time.monotonic() < until:
                time.sleep(0.005)
            if row is not None:
                # With a timeout, pg_terminate_backend returns once the backend has exited (false if it has not).
                killed = conn.execute("SELECT pg_terminate_backend(%s, 30000)", (row[0],)).fetchone()
                conn.rollback()
                assert killed is not None and killed[0], f"backend {row[0]} did not exit"
                return 1
            conn.rollback()
    raise AssertionError("no batch of intents was ever in flight on a lane while the head row was locked")


def _statement_timeout(server: PostgresServer, value: str) -> None:
    """Set the server's statement_timeout for every session (taken at each session's next command)."""
    with psycopg.connect(server.url, autocommit=True, options="-c statement_timeout=0") as conn:
        conn.execute(f"ALTER SYSTEM SET statement_timeout = '{value}'")
        conn.execute("SELECT pg_reload_conf()")


@pytest.mark.parametrize("fault", ["one_lane_killed", "statement_timeout"])
def test_one_lane_killed_or_statements_timed_out_by_the_server_lose_no_intent(fault: str) -> None:
    """One of the two connections killed at a time, or a 1 ms server statement_timeout: no tool without its intent."""
    server = PostgresServer()
    server.start()
    try:
        name = uuid.uuid4().hex[:12]
        url = f"{server.url}&log={name}"
        hits = [0]

        def faults() -> None:
            pause = threading.Event()
            if fault == "one_lane_killed":
                for _ in range(5):
                    pause.wait(0.1)  # the calls go on between kills
                    hits[0] += _kill_one_lane_mid_batch(server, name)
                return
            _statement_timeout(server, "1ms")
            pause.wait(1.5)
            _statement_timeout(server, "0")
            hits[0] = 1

        effects, refused = _run_calls_through_faults(server, url, faults, 4)
        # A killed lane refuses the intents of its batch; a server-wide statement_timeout does not reach the
        # sink's sessions (each sets its own 10 s, with a client deadline beside it), so calls just go on.
        assert hits[0] > 0 and (refused > 0 or fault == "statement_timeout"), (hits, refused)
        _assert_every_effect_has_its_intent(url, effects)
        report = verify_postgres(url)
        assert report.ok, report.failure
    finally:
        server.cleanup()


def test_a_row_forged_after_the_last_checkpoint_stops_the_live_sink_and_is_reported_unsealed(tmp_path: Path) -> None:
    """A row forged at a live signed log's tail: later appends are refused, verify warns of the unsealed tail."""
    server = PostgresServer()
    server.start()
    try:
        name = uuid.uuid4().hex[:12]
        url = f"{server.url}&log={name}"
        generate_keypair(tmp_path / "k")
        log = PostgresAuditLog(url, signing_key=tmp_path / "k", checkpoint_every=4)
        try:
            for i in range(10):
                assert log.append("call_intent", {"call_id": f"c{i}", "run_id": "r", "tool": "t"}).ok
            with psycopg.connect(server.url, autocommit=True) as conn:
                seq, head = conn.execute("SELECT seq, head FROM proctor_audit_logs WHERE name = %s",
                                         (name,)).fetchone()  # type: ignore[misc]
                line, h = seal({"kind": "call_intent", "call_id": "c-forged", "run_id": "r", "tool": "t",
                                "ts_ns": 1, "seq": seq, "prev": head})
                conn.execute("INSERT INTO proctor_audit_records (log, seq, kind, line, h) VALUES (%s, %s, %s, %s, %s)",
                             (name, seq, "call_intent", line.decode().rstrip("\n"), h))
            for i in range(3):  # the writer's seq is taken: it refuses, with the database's reason
                refused = log.append("call_intent", {"call_id": f"after{i}", "run_id": "r", "tool": "t"})
                assert not refused.ok and refused.error is not None and "duplicate key" in refused.error
        finally:
            log.close()
        report = verify_postgres(url, pubkey=tmp_path / "k.pub")
        assert report.ok and report.last_checkpoint_seq is not None and report.last_checkpoint_seq < seq
        assert any(w.startswith("unsealed tail") for w in report.warnings), report.warnings
    finally:
        server.cleanup()


def _database(server: PostgresServer, **settings: str) -> str:
    """A new database on `server` with `ALTER DATABASE … SET` settings; the audit log's URL on it."""
    name = "faults_" + uuid.uuid4().hex[:10]
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
        for key, value in settings.items():
            conn.execute(f"ALTER DATABASE {name} SET {key} = '{value}'")
    return f"postgresql://postgres@/{name}?host={server.sockets}&log=faults"


# A writer that stops for good inside its checkpoint transaction, after locking the log's row (as a process
# stopped by SIGSTOP, a paused VM or a host cut off without a reset would).
_STALLED = """
import sys, time
from proctor.audit import postgres
def stall(self, hashes):
    print("stalled", flush=True)
    time.sleep(3600)
postgres.MerkleFrontier.extend = stall
log = postgres.PostgresAuditLog(sys.argv[1], checkpoint_every=1)
log.append("call_intent", {"call_id": "stalled", "run_id": "r", "tool": "t"})
"""


def test_a_writer_stalled_inside_its_checkpoint_does_not_refuse_the_others(postgres_server: PostgresServer) -> None:
    """The server ends a stalled writer's transaction (idle_in_transaction_session_timeout, 5 s) and the others'
    appends, and a new writer's open, wait for it instead of being refused for as long as it is stalled."""
    url = _database(postgres_server)
    stalled = subprocess.Popen([sys.executable, "-c", _STALLED, url], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert stalled.stdout is not None and stalled.stdout.readline().strip() == "stalled"
        began = time.monotonic()
        other = PostgresAuditLog(url)  # its open waits for the locked row too
        try:
            results = [other.append("call_intent", {"call_id": f"c{i}", "run_id": "r", "tool": "t"})
                       for i in range(3)]
        finally:
            other.close()
        assert all(r.ok for r in results), [r.error for r in results]
        assert time.monotonic() - began < 9.0
        report = verify_postgres(url)
        assert report.ok, report.failure
    finally:
        stalled.kill()
        stalled.communicate()


def test_a_database_defaulting_to_repeatable_read_refuses_no_intent(postgres_server: PostgresServer) -> None:
    """Concurrent writers on a database whose default isolation is REPEATABLE READ: the sink's sessions run READ
    COMMITTED, so their row locks wait instead of failing with serialization errors."""
    url = _database(postgres_server, default_transaction_isolation="repeatable read")
    logs = [PostgresAuditLog(url, checkpoint_every=25) for _ in range(4)]
    refused: list[str] = []

    def write(log: PostgresAuditLog, w: int) -> None:
        for i in range(100):
            result = log.append("call_intent", {"call_id": f"{w}-{i}", "run_id": "r", "tool": "t"})
            if not result.ok:
                refused.append(str(result.error))

    threads = [threading.Thread(target=write, args=(log, w)) for w, log in enumerate(logs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for log in logs:
        log.close()
    assert refused == []
    report = verify_postgres(url)
    assert report.ok, report.failure


def test_a_session_the_server_ended_while_idle_is_replaced_before_the_next_intent(
        postgres_server: PostgresServer) -> None:
    """idle_session_timeout (or a restart, a failover, a pooler) ended the idle session: the next append reconnects
    first instead of failing on the dead session."""
    url = _database(postgres_server, idle_session_timeout="1s")
    log = PostgresAuditLog(url)
    try:
        assert log.append("call_intent", {"call_id": "c0", "run_id": "r", "tool": "t"}).ok
        time.sleep(1.6)
        result = log.append("call_intent", {"call_id": "c1", "run_id": "r", "tool": "t"})
        assert result.ok, result.error
    finally:
        log.close()


def test_a_writer_without_the_fleets_key_is_refused_at_open(postgres_server: PostgresServer, tmp_path: Path) -> None:
    """Once the chain's checkpoints are signed, a writer with no key or another key cannot open it (its unsigned
    checkpoint would make `verify --pubkey` refuse the whole log for good): the error names the key to use."""
    url = _database(postgres_server)
    generate_keypair(tmp_path / "fleet")
    generate_keypair(tmp_path / "other")
    signed = PostgresAuditLog(url, signing_key=tmp_path / "fleet", checkpoint_every=2)
    try:
        for i in range(3):
            assert signed.append("call_intent", {"call_id": f"c{i}", "run_id": "r", "tool": "t"}).ok
        with pytest.raises(ProctorError, match=r"signed by ed25519:.*no signing key.*PROCTOR_AUDIT_KEY"):
            PostgresAuditLog(url)
        with pytest.raises(ProctorError, match=r"signed by ed25519:.*this writer's key is ed25519:"):
            PostgresAuditLog(url, signing_key=tmp_path / "other")
        PostgresAuditLog(url, signing_key=tmp_path / "fleet").close()  # the fleet's key: welcome
    finally:
        signed.close()
    report = verify_postgres(url, pubkey=tmp_path / "fleet.pub")
    assert report.ok, report.failure


def test_a_keyless_writer_opened_before_the_first_signed_checkpoint_writes_no_checkpoint(
        postgres_server: PostgresServer, tmp_path: Path) -> None:
    """A writer without the key that opened while the chain had no checkpoint yet keeps appending, but writes no
    checkpoint after a signed one: the log still verifies with the fleet's public key."""
    url = _database(postgres_server)
    generate_keypair(tmp_path / "fleet")
    keyless = PostgresAuditLog(url, checkpoint_every=1)
    signed = PostgresAuditLog(url, signing_key=tmp_path / "fleet", checkpoint_every=1)
    try:
        assert signed.append("call_intent", {"call_id": "a", "run_id": "r", "tool": "t"}).ok
        for i in range(3):
            assert keyless.append("call_intent", {"call_id": f"b{i}", "run_id": "r", "tool": "t"}).ok
        assert signed.append("call_intent", {"call_id": "c", "run_id": "r", "tool": "t"}).ok
    finally:
        keyless.close()
        signed.close()
    kinds = [r["kind"] for r in _exported(url)]
    assert kinds.count("call_intent") == 5
    report = verify_postgres(url, pubkey=tmp_path / "fleet.pub")
    assert report.ok, report.failure
