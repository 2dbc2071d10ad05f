"""A PostgreSQL audit log reads one run's records through an index on the records' run, and a table of an earlier
version (no run column) is brought up to it while writers keep appending, old and new, the chain intact."""

from __future__ import annotations

import json
import threading
import uuid

import psycopg
from fleet_engines import PostgresServer

from proctor.audit.postgres import INDEXES, PostgresAuditLog, verify_postgres


def _url(server: PostgresServer) -> tuple[str, str]:
    name = uuid.uuid4().hex[:12]
    return f"{server.url}&log={name}", name


def _calls(log: PostgresAuditLog, run_id: str, n: int) -> None:
    for i in range(n):
        assert log.append("call_intent", {"call_id": f"{run_id}-{i}", "run_id": run_id, "tool": "t",
                                          "args": {"note": '"run_id":"run_a"'}}).ok
        assert log.append("call_outcome", {"call_id": f"{run_id}-{i}", "run_id": run_id, "tool": "t",
                                           "status": "ok"}, durable=False).ok


def _old_parts(i: int) -> str:
    """A call_intent as a writer of the earlier version sends it: kind, then its canonical line cut where h, prev and
    seq go (A "h":"<h>", B <prev> C <seq> D), five parts joined by U+001F, and no run of its own."""
    return "\x1f".join(("call_intent", f'{{"call_id":"old-{i}",', '"kind":"call_intent","prev":"',
                        '","run_id":"run_old","seq":', ',"tool":"t","ts_ns":1}'))


def _plan(conn: psycopg.Connection[object], name: str, run_id: str) -> str:
    rows = conn.execute("EXPLAIN SELECT seq, line FROM proctor_audit_records WHERE log = %s AND run_id = %s",
                        (name, run_id)).fetchall()
    return "\n".join(str(r[0]) for r in rows)


def test_a_runs_records_come_from_the_run_index_not_from_other_runs(postgres_server: PostgresServer) -> None:
    """Each record's run is kept as the writer gave it ('' for none); a record of another run that quotes the run's
    id in its arguments is not the run's; the reader's lookup is an index scan."""
    url, name = _url(postgres_server)
    with PostgresAuditLog(url) as log:
        _calls(log, "run_a", 3)
        _calls(log, "run_b", 3)
        assert log.append("policy_changed", {"sha256": "x"}).ok
        got = log.run_records("run_a")
        assert [r["call_id"] for r in got] == [f"run_a-{i}" for i in range(3) for _ in (0, 1)]
        assert [r["seq"] for r in got] == sorted(r["seq"] for r in got)
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        runs = conn.execute("SELECT run_id, count(*) FROM proctor_audit_records WHERE log = %s GROUP BY 1 ORDER BY 1",
                            (name,)).fetchall()
        assert runs == [("", 2), ("run_a", 6), ("run_b", 6)]  # (the policy change, the closing checkpoint)
        conn.execute("SET enable_seqscan = off")
        assert "proctor_audit_records_run" in _plan(conn, name, "run_a")


def test_an_earlier_tables_records_are_indexed_while_old_and_new_writers_append(
        postgres_server: PostgresServer) -> None:
    """The table as an earlier version left it (rows without a run, no indexes, none of this version's functions),
    a writer of that version still appending through its five-part function, and one of this version appending
    all along: opening a sink migrates (column, indexes built concurrently, rows filled in), no append fails, the
    chain verifies, and every run's records are found — also a row whose run the database could not fill in."""
    url, name = _url(postgres_server)
    with PostgresAuditLog(url) as log:
        _calls(log, "run_a", 20)
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        conn.execute("DROP FUNCTION proctor_audit_append_runs(text, text)")
        conn.execute("DROP PROCEDURE proctor_audit_append_runs_durable(text, text, text)")
        for index, _ in INDEXES:
            conn.execute(f"DROP INDEX {index}")
        conn.execute("UPDATE proctor_audit_records SET run_id = NULL WHERE log = %s", (name,))
    stop, failures = threading.Event(), []

    def old_writer() -> None:  # the five parts of an earlier version's template, through its function
        with psycopg.connect(postgres_server.url, autocommit=True) as conn:
            i = 0
            while not stop.is_set() or i < 5:
                # a batch of one, then of two (the function's two paths)
                batch = _old_parts(i) if i % 2 == 0 else _old_parts(i) + "\x1f" + _old_parts(i + 100_000)
                conn.execute("SELECT proctor_audit_append_batch(%s, %s)", (name, batch))
                i += 1

    def new_writer(log: PostgresAuditLog) -> None:
        i = 0
        while not stop.is_set() or i < 5:
            if not log.append("call_intent", {"call_id": f"new-{i}", "run_id": "run_new", "tool": "t"}).ok:
                failures.append(i)
            i += 1

    with PostgresAuditLog(url) as writer:
        threads = [threading.Thread(target=old_writer), threading.Thread(target=new_writer, args=(writer,))]
        for t in threads:
            t.start()
        with PostgresAuditLog(url) as opener:  # the migration, under both writers
            pass
        stop.set()
        for t in threads:
            t.join()
        assert not failures
        with psycopg.connect(postgres_server.url, autocommit=True) as conn:
            valid = conn.execute("SELECT c.relname FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid "
                                 "WHERE i.indisvalid AND c.relname = ANY(%s)", ([n for n, _ in INDEXES],)).fetchall()
            assert sorted(v[0] for v in valid) == sorted(n for n, _ in INDEXES)
            # (rows the old writer appended after the fill-in pass have their run from the replaced function)
            unknown = conn.execute("SELECT count(*) FROM proctor_audit_records WHERE log = %s AND run_id IS NULL",
                                   (name,)).fetchone()
            assert unknown == (0,)
            conn.execute("UPDATE proctor_audit_records SET run_id = NULL WHERE log = %s AND seq = 3", (name,))
            every = [r[0] for r in conn.execute("SELECT line FROM proctor_audit_records WHERE log = %s ORDER BY seq",
                                                (name,)).fetchall()]
        for run_id in ("run_a", "run_old", "run_new"):
            expected = [json.loads(line) for line in every if json.loads(line).get("run_id") == run_id]
            assert writer.run_records(run_id) == expected and expected
        assert opener.closed
    report = verify_postgres(url)
    assert report.ok, report
