"""The PostgreSQL run store passes the store contract on a real server, and wakes waiters by NOTIFY."""

from __future__ import annotations

import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fleet_engines import PostgresServer
from store_conformance import StoreConformance, StoreForgeryConformance, _approval
from store_forgery import DURING, TWICE, suspended

from proctor.errors import StoreError
from proctor.store import ApprovalAnswer, RunStore
from proctor.store.postgres import PostgresRunStore


@pytest.fixture
def pg(postgres_server: PostgresServer) -> PostgresServer:
    """The suite's PostgreSQL (tests/conftest.py): each test works in a fresh schema of its own (`_fresh`)."""
    return postgres_server


def _fresh(server: PostgresServer) -> str:
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{server.url}&options=-csearch_path%3D{schema}"


class TestPostgresStore(StoreConformance):
    """The conformance suite against a fresh schema of a real PostgreSQL."""

    @pytest.fixture
    def store_url(self, pg: PostgresServer) -> str:
        return _fresh(pg)


class TestPostgresStoreForgery(StoreForgeryConformance):
    """The forgery cases against the same kind of store."""

    @pytest.fixture
    def store_url(self, pg: PostgresServer) -> str:
        return _fresh(pg)


@pytest.mark.sandbox
def test_a_rollback_is_caught_against_a_postgresql_audit_log(pg: PostgresServer, tmp_path: Path) -> None:
    """Store and audit trail both in PostgreSQL: the resume reads the run's records from the log's table and
    refuses an entry put back to its suspended version; `audit verify URL --store URL` reports it."""
    for run in suspended(_fresh(pg), tmp_path, audit=f"{pg.url}&log={uuid.uuid4().hex[:12]}"):
        run.start()
        before, [(run_key, record)] = dict(run.rows.all("journal")), run.rows.all("runs")
        run.approve()
        assert run.resumed() == "done" and run.sent() == ["x@evil.test"]
        assert "agrees with the log: 1 run(s), 3 journal entries, 1 approval(s)" in run.verify(expect=0).stdout
        run.rows.set("runs", run_key, record)  # the run and its mail's entry as sealed at the suspension
        key = f"{run.run_id}:1:2"
        run.rows.set("journal", key, before[key])
        out = run.verify(expect=1).stdout
        assert "step 1, journal entry 2 (send): journaled as suspended, but the audit trail records" in out, out
        assert "the audit trail records it finished (done" in out, out
        assert "the audit trail records it finished (done" in run.refused()
        assert run.sent() == ["x@evil.test"]


@pytest.mark.sandbox
def test_a_done_entry_put_back_to_its_intent_is_caught_against_a_postgresql_audit_log(
        pg: PostgresServer, tmp_path: Path) -> None:
    """Store and trail in PostgreSQL, the trail shared with another run: the mail's entry put back to the intent
    sealed while it ran is refused (the log's outcome, read through the run index, says the store had it done)."""
    audit = f"{pg.url}&log={uuid.uuid4().hex[:12]}"
    for run in suspended(_fresh(pg), tmp_path, audit=audit):
        run.start()  # another run in the same log
        run.start(TWICE)
        key, kept = f"{run.run_id}:1:1", dict[str, Any]()
        DURING.append(lambda kept=kept, rows=run.rows: kept.update(rows.all("journal")))
        run.approve()
        assert run.resumed() == "suspended" and run.sent() == ["a@evil.test"]
        DURING.clear()
        done = dict(run.rows.all("journal"))[key]
        run.rows.set("journal", key, kept[key])
        run.approve()
        message = run.refused()
        assert "step 1, journal entry 1 (send): journaled as intent" in message, message
        assert run.sent() == ["a@evil.test"]
        run.rows.set("journal", key, done)
        assert run.resumed() == "done" and run.sent() == ["a@evil.test", "b@evil.test"]


def test_open_by_url_gives_the_postgres_store(pg: PostgresServer) -> None:
    """RunStore.open(postgresql://…) is a PostgresRunStore."""
    store = RunStore.open(_fresh(pg))
    try:
        assert isinstance(store, PostgresRunStore)
    finally:
        store.close()


def test_a_waiting_run_wakes_on_notify_not_on_a_poll(pg: PostgresServer) -> None:
    """An answer from another connection wakes wait_for_answer at once (well before a 60 s timeout)."""
    url = _fresh(pg)
    waiter, answerer = RunStore.open(url), RunStore.open(url)
    try:
        filed = waiter.file_approval(_approval())
        got: list[object] = []
        thread = threading.Thread(target=lambda: got.append(waiter.wait_for_answer(filed.id, 60)))
        began = time.monotonic()
        thread.start()
        time.sleep(0.5)
        answerer.answer_approval(filed.id, ApprovalAnswer("approve", "bob"), binding=filed.binding)
        thread.join(timeout=30)
        assert got and getattr(got[0], "status", None) == "answered"
        assert time.monotonic() - began < 30
    finally:
        waiter.close()
        answerer.close()


def test_unreachable_server_is_a_store_error(tmp_path: Path) -> None:
    """A server that is not there fails to open with StoreError naming the store."""
    with pytest.raises(StoreError, match="cannot open run store"):
        PostgresRunStore(f"postgresql://postgres@/postgres?host={tmp_path}", connect_timeout_s=2)


@pytest.mark.sandbox
def test_answers_are_sealed_with_a_postgresql_trails_key(pg: PostgresServer, tmp_path: Path) -> None:
    """Store and audit trail both in PostgreSQL: "approve by bob" written into the approvals table is refused on
    resume (recorded in the log's table), and the real CLI, given the trail's URL, answers so that the run goes on."""
    import subprocess

    for run in suspended(_fresh(pg), tmp_path, audit=f"{pg.url}&log={uuid.uuid4().hex[:12]}"):
        run.start()
        [pending] = run.store.list_approvals(run_id=run.run_id)
        run.answer_by_hand(pending.id, {**StoreForgeryConformance.HAND_WRITTEN})
        assert run.resumed() == "suspended" and run.sent() == []
        [refused] = run.approval_refusals()
        assert refused["code"] == "seal" and refused["approval_id"] == pending.id
        done = subprocess.run([sys.executable, "-m", "proctor.cli", "approvals", "approve", pending.id, "--store",
                               run.rows.url, "--audit", run.log, "--reason", "checked"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        answer = run.store.get_approval(pending.id).answer
        assert answer is not None and answer.method == "os-user" and run.answers.problem(
            run.store.get_approval(pending.id)) is None
        assert run.resumed() == "done" and run.sent() == ["x@evil.test"]
