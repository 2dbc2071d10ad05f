"""The PostgreSQL audit sink on a real server: same chain and verdicts as the file log, many writers, fail closed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import psycopg
import pytest
from fleet_engines import PostgresServer

from proctor import Gate, Policy, tool
from proctor.audit import generate_keypair, verify
from proctor.audit.postgres import PostgresAuditLog, export_jsonl, verify_postgres
from proctor.cli import main
from proctor.errors import AuditError

WRITER = str(Path(__file__).with_name("audit_writer.py"))

#: A redaction mark's keyed digest (random per key): masked before looking for clear values.
_MARK = re.compile(r"hmac-sha256:[0-9a-f]{64}")


def _url(server: PostgresServer) -> str:
    return f"{server.url}&log={uuid.uuid4().hex[:12]}"


def _fill(url: str, n: int, **options: object) -> None:
    with PostgresAuditLog(url, **options) as log:  # type: ignore[arg-type]
        for i in range(n):
            assert log.append("call_intent", {"call_id": f"c{i}", "run_id": "r", "tool": "t", "args": {"i": i}}).ok
            assert log.append("call_outcome", {"call_id": f"c{i}", "run_id": "r", "tool": "t", "status": "ok"}).ok


def test_signed_chain_verifies_in_the_database_and_as_exported_jsonl(postgres_server: PostgresServer,
                                                                     tmp_path: Path) -> None:
    """A log with signed checkpoints verifies by URL, and its JSON Lines export verifies with the file verifier."""
    url = _url(postgres_server)
    key, pub = tmp_path / "k", tmp_path / "k.pub"
    generate_keypair(key)
    _fill(url, 30, signing_key=key, checkpoint_every=16)
    report = verify_postgres(url, pubkey=pub)
    assert report.ok and report.records > 60 and report.signed_checkpoints >= 3, report.failure
    out = tmp_path / "audit.jsonl"
    assert main(["audit", "export", url, str(out)]) == 0
    exported = verify(out, pubkey=pub)
    assert exported.ok and (exported.records, exported.root) == (report.records, report.root)
    assert main(["audit", "verify", url, "--pubkey", str(pub)]) == 0


def _tamper(url: str, sql: str) -> None:
    conninfo, _, query = url.partition("?")
    host = query.split("host=")[1].split("&")[0]
    name = query.split("log=")[1]
    with psycopg.connect(f"{conninfo}?host={host}", autocommit=True) as conn:
        conn.execute(sql.replace("LOG", f"'{name}'"))


@pytest.mark.parametrize(("sql", "code"), [
    ("UPDATE proctor_audit_records SET line = replace(line, '\"i\":3', '\"i\":4') WHERE log = LOG AND seq = 6",
     "HASH_MISMATCH"),
    ("DELETE FROM proctor_audit_records WHERE log = LOG AND seq = 9", "SEQ_GAP"),
    ("DELETE FROM proctor_audit_records WHERE log = LOG AND seq > 20", "ROLLBACK"),
])
def test_tampering_in_the_database_gets_the_file_verdicts(postgres_server: PostgresServer, sql: str,
                                                           code: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A changed record, a deleted one and a cut tail are found and named as in a file log."""
    url = _url(postgres_server)
    _fill(url, 12, checkpoint_every=1000)
    assert verify_postgres(url).ok
    _tamper(url, sql)
    report = verify_postgres(url)
    assert not report.ok and report.failure is not None
    assert report.failure.code == code, report.failure
    assert main(["audit", "verify", url]) == 1
    assert "TAMPERED or corrupt" in capsys.readouterr().out


def test_gate_writes_intent_before_the_tool_and_outcome_after(postgres_server: PostgresServer) -> None:
    """Through a Gate, each call leaves an intent then an outcome in the database, redacted as a file log would."""
    url = _url(postgres_server)
    seen: list[int] = []

    @tool(side_effect="write")
    def pay(card: str, amount: int) -> int:
        """Pay.

        Args:
            card: Card number.
            amount: Amount.
        """
        seen.append(amount)
        return amount

    policy = Policy.from_dict({"version": 1, "default": "allow", "tools": {"pay": {"redact": ["card"]}}})
    sink = PostgresAuditLog(url)
    gate = Gate(policy, audit=sink, tools=[pay])
    ctx = gate.start_run(principal="alice")
    assert gate.call("pay", {"card": "4111", "amount": 5}, context=ctx) == 5
    gate.finish_run(ctx)
    sink.close()
    out = Path(export_path := f"/tmp/{uuid.uuid4().hex}.jsonl")
    try:
        with out.open("wb") as f:
            export_jsonl(url, f)
        records = [json.loads(line) for line in out.read_text().splitlines()]
    finally:
        out.unlink()
        Path(export_path + ".checkpoint").unlink(missing_ok=True)
    kinds = [r["kind"] for r in records]
    assert kinds[:4] == ["run_started", "call_intent", "call_outcome", "run_finished"] and kinds[-1] == "checkpoint"
    # The keyed digest is random hex that may hold "4111" by chance (about 1 run in 1,000): look past it.
    assert "4111" not in _MARK.sub("", json.dumps(records[1]["args"]))


def test_many_writers_in_many_processes_append_to_one_chain(postgres_server: PostgresServer) -> None:
    """4 processes x 4 threads x 25 appends make one intact chain of 400 records (plus checkpoints)."""
    url = _url(postgres_server)
    PostgresAuditLog(url).close()  # create the log first
    procs = [subprocess.Popen([sys.executable, WRITER, url, "4", "25"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
    report = verify_postgres(url)
    assert report.ok, report.failure
    assert report.records - report.checkpoints == 400


def test_lost_connection_refuses_intents_and_no_tool_runs_without_one(postgres_server: PostgresServer) -> None:
    """With PostgreSQL gone the call is refused (AuditError) and the tool does not run; afterwards calls go on."""
    url = _url(postgres_server)
    runs: list[int] = []

    @tool(side_effect="external")
    def send() -> int:
        """Send."""
        runs.append(1)
        return len(runs)

    sink = PostgresAuditLog(url)
    gate = Gate(Policy.from_dict({"version": 1, "default": "allow"}), audit=sink, tools=[send])
    ctx = gate.start_run()
    assert gate.call("send", context=ctx) == 1
    postgres_server.stop()
    try:
        with pytest.raises(AuditError, match="could not record the call before it ran"):
            gate.call("send", context=ctx)
        assert runs == [1]
    finally:
        postgres_server.start()
    assert gate.call("send", context=ctx) == 2
    sink.close()
    report = verify_postgres(url)
    assert report.ok, report.failure


def test_unreachable_database_refuses_to_open(tmp_path: Path) -> None:
    """Opening a sink on a server that is not there raises AuditError naming the URL."""
    with pytest.raises(AuditError, match="cannot open the audit log"):
        PostgresAuditLog(f"postgresql://postgres@/postgres?host={tmp_path}&connect_timeout=2")


def test_threads_share_one_sink_and_its_commits(postgres_server: PostgresServer) -> None:
    """16 threads appending through one sink all get distinct seqs, and the chain verifies."""
    url = _url(postgres_server)
    seqs: list[int] = []
    with PostgresAuditLog(url) as log:
        def write(n: int) -> None:
            for i in range(20):
                r = log.append("step", {"run_id": "r", "n": n, "i": i})
                assert r.ok and r.seq is not None
                seqs.append(r.seq)

        threads = [threading.Thread(target=write, args=(n,)) for n in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(set(seqs)) == 320
    assert verify_postgres(url).ok


def test_one_appending_thread_keeps_one_connection_and_overlapping_threads_at_most_two(
        postgres_server: PostgresServer) -> None:
    """Appends one at a time use one connection; 8 threads appending at once use at most two, in one chain."""
    url = _url(postgres_server)
    with PostgresAuditLog(url) as log:
        for i in range(50):
            assert log.append("step", {"run_id": "r", "i": i}).ok
        assert log.connections == 1
        seqs: list[int] = []

        def write(n: int) -> None:
            for i in range(40):
                r = log.append("call_intent", {"call_id": f"{n}-{i}", "run_id": "r", "tool": "t"})
                assert r.ok and r.seq is not None
                seqs.append(r.seq)

        threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert 1 <= log.connections <= 2
    assert sorted(seqs) == sorted(set(seqs)) and len(seqs) == 320
    report = verify_postgres(url)
    assert report.ok and report.records == 50 + 320 + 1, report.failure


def test_a_durable_append_returns_only_after_its_wal_is_flushed() -> None:
    """A durable append is on disk when it returns; a non-durable one is left to the WAL writer."""
    server = PostgresServer(settings={"wal_writer_delay": "10s"})  # the WAL writer flushes nothing meanwhile
    try:
        server.start()
        with psycopg.connect(server.url, autocommit=True) as conn, \
                PostgresAuditLog(f"{server.url}&log=flush") as log:
            def flushed(durable: bool) -> int:
                count = 0
                for i in range(10):
                    assert log.append("step", {"run_id": "r", "i": i}, durable=durable).ok
                    row = conn.execute("SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn()").fetchone()
                    count += bool(row and row[0])
                return count

            # (background WAL, e.g. a standby snapshot, may land between an append and the check: 8 of 10)
            assert flushed(True) >= 8
            assert flushed(False) <= 2
    finally:
        server.cleanup()


def test_a_reader_verifying_while_writers_append_sees_a_whole_log_every_time(postgres_server: PostgresServer,
                                                                             tmp_path: Path) -> None:
    """verify by URL, run again and again while 4 threads append to a signed log, passes every time (one snapshot)."""
    url = _url(postgres_server)
    key, pub = tmp_path / "k", tmp_path / "k.pub"
    generate_keypair(key)
    done = threading.Event()
    failures: list[str] = []
    with PostgresAuditLog(url, signing_key=key, checkpoint_every=7) as log:
        for i in range(10):  # past the first signed checkpoint (before it, a key's verify says none is signed yet)
            assert log.append("run_started", {"run_id": f"r{i}"}).ok

        def writer(n: int) -> None:
            for i in range(150):
                if not log.append("call_intent", {"call_id": f"w{n}-{i}", "run_id": "r", "tool": "t"}).ok:
                    failures.append(f"append w{n}-{i} failed")
            done.set()

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        verified = 0
        while not done.is_set() or verified < 3:
            report = verify_postgres(url, pubkey=pub)
            if not report.ok:
                failures.append(f"verify: {report.failure}")
            verified += 1
        for t in threads:
            t.join()
    assert failures == []
    final = verify_postgres(url, pubkey=pub)
    assert final.ok and final.records > 600, final.failure
