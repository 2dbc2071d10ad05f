"""`PostgresAuditLog`: the audit trail in PostgreSQL, one hash chain shared by many writers.

The records are the file log's, byte for byte: the same canonical lines, envelope,
hash chain (``h = sha256(0x00 ‖ record without h)``) and signed checkpoints, so
`export_jsonl` writes a file `proctor audit verify` accepts, and `verify_postgres`
reaches the same verdicts on the same evidence.

Many writers, in many processes and on many hosts, append to one chain. The chain
is serialised in the database: ``proctor_audit_append_runs`` locks the log's row, gives
each record the next ``seq`` and the current head as ``prev``, hashes it with
PostgreSQL's own ``sha256`` and inserts the batch — one statement, one round trip. The
client sends a batch as one text: each record's canonical JSON cut at the places where
``h``, ``prev`` and ``seq`` go; nothing of the record is re-encoded in the database.

Durable on commit, with group commit at two levels:
- in the process, concurrent appends wait for one writer thread, which sends every
  record queued at that moment in one call (one transaction);
- across processes, that transaction commits without waiting for the disk (so the row
  lock is held for microseconds, not for a flush), and the writer then commits a tiny
  synchronous transaction (a logical WAL message, no row): its flush covers every earlier commit in the WAL, and
  PostgreSQL flushes the concurrent ones together. An append returns ok only after
  that flush; the WAL is a sequence, so a crash loses only a suffix of the chain, and
  never a record some later durable record points to.

A lost connection fails the appends in flight (the gate refuses those calls: fail
closed); the next append reconnects. Schema: ``proctor_audit_logs`` (one row per log:
head, seq, last checkpoint, Merkle frontier at it, redaction key) and
``proctor_audit_records`` (log, seq, kind, line, h, run_id: the record's run, indexed, so that a
durable run's resume reads only its own records; `ensure_schema` adds it to an earlier version's
table while writers append). URL:
``postgresql://user@host/db?log=NAME`` (``log`` defaults to ``default``).
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import select
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import pq

from proctor.audit.base import AuditResult, derive_key
from proctor.audit.keys import KeySource, key_id, load_private_key, public_raw
from proctor.audit.merkle import MerkleFrontier
from proctor.audit.records import GENESIS, append_problem, checkpoint_statement
from proctor.audit.verify import VerifyReport, side_file_path, verify
from proctor.canonical import canonical_bytes
from proctor.errors import AuditError
from proctor.pgconn import READ_COMMITTED, PgConnection, why
from proctor.redaction import Redacted, redact_args
from proctor.urls import shown_url

__all__ = ["SCHEMA", "PostgresAuditLog", "export_jsonl", "is_postgres_url", "redaction_secret", "verify_postgres"]


SCHEMA = r"""
CREATE TABLE IF NOT EXISTS proctor_audit_logs (
    name text PRIMARY KEY,
    log_id text NOT NULL,
    seq bigint NOT NULL DEFAULT 0,
    head text NOT NULL,
    redact_key bytea NOT NULL,
    last_ckpt bigint,
    ckpt_line text,
    frontier_size bigint NOT NULL DEFAULT 0,
    frontier text[] NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS proctor_audit_writers (
    id text PRIMARY KEY,
    flushes bigint NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS proctor_audit_records (
    log text NOT NULL,
    seq bigint NOT NULL,
    kind text NOT NULL,
    line text NOT NULL,
    h text NOT NULL,
    run_id text,
    PRIMARY KEY (log, seq)
);
-- run_id: the record's top-level run_id ('' when it has none; NULL when not known: a row written before the
-- column existed and not filled in yet, or one whose run_id the database cannot read). A run's records are
-- found through the index on it, and the NULL rows by their text (proctor_audit_records_unknown).
ALTER TABLE proctor_audit_records ADD COLUMN IF NOT EXISTS run_id text;
CREATE OR REPLACE FUNCTION proctor_audit_run_of(p_line text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE j json;
BEGIN
    j := p_line::json -> 'run_id';
    IF j IS NULL OR json_typeof(j) <> 'string' THEN RETURN ''; END IF;
    RETURN j #>> '{}';
EXCEPTION WHEN OTHERS THEN
    RETURN NULL;  -- unreadable here (a \u0000 escape, say): left to the text search
END
$$;
-- proctor_audit_append and proctor_audit_append_durable: the batch functions of earlier versions,
-- kept so that writers not yet upgraded append to the same chain (same row lock).
CREATE OR REPLACE FUNCTION proctor_audit_append(
    p_log text, p_kind text[], p_n0 text[], p_n1 text[], p_n2 text[],
    p_f0 text[], p_f1 text[], p_f2 text[], p_f3 text[])
RETURNS TABLE(out_seq bigint, out_h text, out_last_ckpt bigint)
LANGUAGE plpgsql AS $$
DECLARE
    s bigint; hd text; ck bigint; body text; hh text;
BEGIN
    SELECT l.seq, l.head, l.last_ckpt INTO s, hd, ck FROM proctor_audit_logs l WHERE l.name = p_log FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no proctor audit log named %', p_log;
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_kind, 1), 0) LOOP
        body := p_n0[i] || hd || p_n1[i] || s::text || p_n2[i];
        hh := encode(sha256('\x00'::bytea || convert_to(body, 'UTF8')), 'hex');
        INSERT INTO proctor_audit_records (log, seq, kind, line, h, run_id)
            VALUES (p_log, s, p_kind[i], p_f0[i] || hh || p_f1[i] || hd || p_f2[i] || s::text || p_f3[i], hh,
                    proctor_audit_run_of(p_f0[i] || hh || p_f1[i] || hd || p_f2[i] || s::text || p_f3[i]));
        IF p_kind[i] = 'checkpoint' THEN ck := s; END IF;
        out_seq := s; out_h := hh; out_last_ckpt := ck;
        RETURN NEXT;
        hd := hh;
        s := s + 1;
    END LOOP;
    UPDATE proctor_audit_logs SET seq = s, head = hd, last_ckpt = ck WHERE name = p_log;
END
$$;
CREATE OR REPLACE PROCEDURE proctor_audit_append_durable(
    p_log text, p_writer text, p_kind text[], p_n0 text[], p_n1 text[], p_n2 text[],
    p_f0 text[], p_f1 text[], p_f2 text[], p_f3 text[],
    INOUT out_seq bigint[] DEFAULT NULL, INOUT out_h text[] DEFAULT NULL, INOUT out_last_ckpt bigint[] DEFAULT NULL)
LANGUAGE plpgsql AS $$
BEGIN
    -- The records, in a transaction committed without waiting for the disk: the chain's row
    -- lock is held for the microseconds of the inserts, not for a flush.
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT array_agg(a.out_seq ORDER BY a.out_seq), array_agg(a.out_h ORDER BY a.out_seq),
           array_agg(a.out_last_ckpt ORDER BY a.out_seq)
      INTO out_seq, out_h, out_last_ckpt
      FROM proctor_audit_append(p_log, p_kind, p_n0, p_n1, p_n2, p_f0, p_f1, p_f2, p_f3) a;
    COMMIT;
    -- The barrier: a transaction that writes a row of this writer's and commits synchronously;
    -- its flush covers every commit before it in the WAL, the records' included, and PostgreSQL
    -- flushes concurrent writers' barriers together. (An upsert: it writes even if the row went.)
    PERFORM set_config('synchronous_commit', 'on', true);
    INSERT INTO proctor_audit_writers (id, flushes) VALUES (p_writer, 1)
        ON CONFLICT (id) DO UPDATE SET flushes = proctor_audit_writers.flushes + 1;
END
$$;
"""

# The batch append, shared by the function (non-durable batches, checkpoints) and the durable procedure
# (inlined there: a plpgsql call inside a procedure cost as much as the chain's row lock). It leaves
# "first-seq count last-checkpoint" in r. p_recs: five or six parts a record (`_batch_body`'s width), all
# separated by U+001F (never raw in canonical JSON): the kind, then the record's canonical line cut where its
# h, prev and seq go (see _template), then this version's run id. A batch of one (every batch of a
# single-writer process) skips the arrays.
_BATCH_DECLARE = r"""
    s bigint; first bigint; hd text; ck bigint; parts text[]; n int; hh text; rest text; r text;
    kinds text[] := '{}'; lines text[] := '{}'; hs text[] := '{}'; runs text[] := '{}';"""


def _batch_body(width: int, run_of_one: str, run_of_each: str) -> str:
    """The batch append for records of `width` parts: the same chain, whatever the layout. `run_of_one` is the
    SQL of the run id of a batch's one record (its parts at 1.., its line as `parts[2] || '"h":"' || hh ||
    '",' || rest`), `run_of_each` that of record i of a longer batch (its parts at `width`*i+1.., its line
    `lines[i+1]`)."""
    w = width
    return rf"""
    parts := string_to_array(p_recs, E'\x1f');
    n := coalesce(array_length(parts, 1), 0) / {w};
    SELECT l.seq, l.head, l.last_ckpt INTO s, hd, ck FROM proctor_audit_logs l WHERE l.name = p_log FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no proctor audit log named %', p_log;
    END IF;
    first := s;
    IF n = 1 THEN
        rest := parts[3] || hd || parts[4] || s::text || parts[5];
        hh := encode(sha256('\x00'::bytea || convert_to(parts[2] || rest, 'UTF8')), 'hex');
        INSERT INTO proctor_audit_records (log, seq, kind, line, h, run_id)
            VALUES (p_log, s, parts[1], parts[2] || '"h":"' || hh || '",' || rest, hh,
                    {run_of_one});
        IF parts[1] = 'checkpoint' THEN ck := s; END IF;
        hd := hh;
        s := s + 1;
    ELSIF n > 1 THEN
        FOR i IN 0 .. n - 1 LOOP
            rest := parts[{w}*i+3] || hd || parts[{w}*i+4] || s::text || parts[{w}*i+5];
            hh := encode(sha256('\x00'::bytea || convert_to(parts[{w}*i+2] || rest, 'UTF8')), 'hex');
            kinds[i+1] := parts[{w}*i+1];
            hs[i+1] := hh;
            lines[i+1] := parts[{w}*i+2] || '"h":"' || hh || '",' || rest;
            runs[i+1] := {run_of_each};
            IF parts[{w}*i+1] = 'checkpoint' THEN ck := s; END IF;
            hd := hh;
            s := s + 1;
        END LOOP;
        INSERT INTO proctor_audit_records (log, seq, kind, line, h, run_id)
            SELECT p_log, first + u.o - 1, u.k, u.l, u.h, u.r
              FROM unnest(kinds, lines, hs, runs) WITH ORDINALITY AS u(k, l, h, r, o);
    END IF;
    UPDATE proctor_audit_logs SET seq = s, head = hd, last_ckpt = ck WHERE name = p_log;
    r := first::text || ' ' || n::text || ' ' || coalesce(ck::text, '');"""


def _append_routines(name: str, declare: str, body: str) -> str:
    """The two ways a writer appends a batch: `name` (committed as the session commits) and `name`_durable (then
    a synchronous barrier), the same declarations and body in each."""
    return f"""
CREATE OR REPLACE FUNCTION {name}(p_log text, p_recs text)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE{declare}
BEGIN{body}
    RETURN r;
END
$$;
CREATE OR REPLACE PROCEDURE {name}_durable(p_log text, p_recs text, INOUT out_r text DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE{declare}
BEGIN
    -- The records, in a transaction committed without waiting for the disk (the sink's sessions run
    -- with synchronous_commit off): the chain's row lock is held for the microseconds of the inserts,
    -- not for a flush.{body}
    out_r := r;
    COMMIT;
    -- The barrier: a transaction that writes WAL (a transactional logical message, which no table
    -- keeps) and commits synchronously; its flush covers every commit before it in the WAL, the
    -- records' included, and PostgreSQL flushes concurrent writers' barriers together.
    PERFORM set_config('synchronous_commit', 'on', true), pg_logical_emit_message(true, 'proctor_audit', '');
END
$$;
"""


# proctor_audit_append_batch and _durable: the five-part functions of earlier writers, kept (and the run_id of
# what they insert read from the line in the database) so that writers not yet upgraded append to the same chain.
SCHEMA += _append_routines("proctor_audit_append_batch", _BATCH_DECLARE, _batch_body(
    5, """proctor_audit_run_of(parts[2] || '"h":"' || hh || '",' || rest)""", "proctor_audit_run_of(lines[i+1])"))
# The writers of this version: six parts a record, the sixth the record's run id as the writer has it ("" for
# none, "r" + the id, "?" for one it cannot carry: then NULL, and found by its text), so the database parses nothing.
SCHEMA += _append_routines("proctor_audit_append_runs", _BATCH_DECLARE, _batch_body(
    6, "CASE WHEN parts[6] = '' THEN '' WHEN left(parts[6], 1) = 'r' THEN substr(parts[6], 2) END",
    "CASE WHEN parts[6*i+6] = '' THEN '' WHEN left(parts[6*i+6], 1) = 'r' THEN substr(parts[6*i+6], 2) END"))
#: The indexes a run's records are read through (`run_records`), built without blocking writers (`_index`).
INDEXES = (("proctor_audit_records_run", "(log, run_id, seq)"),
           ("proctor_audit_records_unknown", "(log, seq) WHERE run_id IS NULL"))
#: Rows of a table written before the run_id column existed, filled in per transaction (`_backfill`).
_BACKFILL_ROWS = 5000

#: How long the writer thread waits for more appends before a flush (PostgreSQL's commit_delay, in-process).
_LINGER_S = 0.002
#: Connections (each with its writer thread) a sink may have batches in flight on. The second is used only
#: while the first is busy and appends are waiting: the next batch is prepared and sent while the current
#: one commits, instead of the appenders and PostgreSQL taking turns. A process with one appending
#: thread never needs it and never opens it.
_LANES = 2
#: An append finding nothing in flight writes its record itself (no hand-over to a writer thread and back:
#: four thread wake-ups, ~40% of a lone appender's CPU) unless appends overlapped this recently.
_SOLO_S = 0.05
#: How long a batch waits for PostgreSQL's answer (client side; the sessions' statement_timeout is 10 s),
#: and an append for its batch (a checkpoint is slower): then they fail, and the gate refuses the call.
_ANSWER_S = 15.0
_APPEND_WAIT_S = 30.0

# A batch goes as ONE text parameter (six parts a record, separated by U+001F) to a statement
# prepared once a connection, sent through libpq directly: psycopg's per-execute work in Python
# (adapting parameters, arrays above all, and reading results) was most of the writer's CPU. A
# durable batch is the append and the durability barrier, two transactions in one CALL (the
# procedure commits between them): one round trip. The result: "first-seq count last-checkpoint".
_SEP = "\x1f"
_APPEND = b"SELECT proctor_audit_append_runs($1, $2)"
_APPEND_DURABLE = b"CALL proctor_audit_append_runs_durable($1, $2, NULL)"
_STATEMENTS = ((b"proctor_audit_append_runs", _APPEND), (b"proctor_audit_append_runs_durable", _APPEND_DURABLE))


def is_postgres_url(target: object) -> bool:
    """True for ``postgresql://…`` and ``postgres://…``."""
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def _split(url: str) -> tuple[str, str]:
    """(conninfo for psycopg, log name) — `log` is taken out of the query."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    name = next((v for k, v in query if k == "log"), "default") or "default"
    rest = [(k, v) for k, v in query if k != "log"]
    return urlunsplit(parts._replace(query=urlencode(rest))), name


def ensure_schema(conn: psycopg.Connection[Any]) -> None:
    """Create the tables and the append functions once (concurrent first writers take turns), and bring a table
    of an earlier version up to this one while its writers go on appending (`_index`, `_backfill`)."""
    with conn.transaction():
        conn.execute("SET LOCAL synchronous_commit = on")
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('proctor_audit_schema'))")
        exists = conn.execute("SELECT to_regprocedure('proctor_audit_append_runs(text, text)') IS NOT NULL "
                              "AND to_regprocedure('proctor_audit_append_runs_durable(text, text, text)') IS NOT NULL"
                              ).fetchone()
        if not (exists and exists[0]):
            # Adding the (nullable, default-less) column only changes the catalog, but it waits for the table's
            # lock behind appends in flight, and new appends queue behind it: bounded, so a long reader (an export)
            # fails this opening instead of stalling every writer.
            conn.execute("SET LOCAL lock_timeout = '5s'")
            conn.execute(SCHEMA)
    _index(conn)


def _index(conn: psycopg.Connection[Any]) -> None:
    """Build the run index (and the one of rows whose run is not known) where missing or left invalid by a build that
    was cut off: CONCURRENTLY, so appends go on meanwhile; then fill in the rows whose run is not known (`_backfill`,
    which walks them by the second index: never before it exists). One opener builds and fills in; another finding
    it busy goes on (a run's records are read correctly meanwhile, only more slowly)."""
    rows = conn.execute("SELECT c.relname, i.indisvalid FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid "
                        "WHERE c.relname = ANY(%s)", ([name for name, _ in INDEXES],)).fetchall()
    valid = {str(name): bool(ok) for name, ok in rows}
    if all(valid.get(name) for name, _ in INDEXES):
        _backfill(conn)  # (rows a writer of the earlier version appended while the schema changed, if any)
        return
    got = conn.execute("SELECT pg_try_advisory_lock(hashtext('proctor_audit_index'))").fetchone()
    if not (got and got[0]):
        return
    try:
        for name, columns in INDEXES:
            if valid.get(name) is False:  # a build cut off leaves an invalid index behind: built again
                conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            if not valid.get(name):
                conn.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON proctor_audit_records {columns}")
        _backfill(conn)
    finally:
        conn.execute("SELECT pg_advisory_unlock(hashtext('proctor_audit_index'))")


def _backfill(conn: psycopg.Connection[Any]) -> None:
    """Fill in the run_id of rows written before the column existed (or by a writer of an earlier version while
    the schema changed), a few thousand a transaction, so appends go on meanwhile. A row whose run_id the database
    cannot read stays NULL and is found by its text (`run_records`); rows are walked in key order, each once."""
    last: tuple[str, int] | None = ("", -1)
    while last is not None:
        row = conn.execute(
            "WITH batch AS (SELECT log, seq FROM proctor_audit_records WHERE run_id IS NULL AND (log, seq) > (%s, %s) "
            "ORDER BY log, seq LIMIT %s), "
            "done AS (UPDATE proctor_audit_records r SET run_id = proctor_audit_run_of(r.line) FROM batch b "
            "WHERE r.log = b.log AND r.seq = b.seq AND r.run_id IS NULL RETURNING 1) "
            "SELECT (SELECT count(*) FROM done), b.log, b.seq FROM batch b ORDER BY b.log DESC, b.seq DESC LIMIT 1",
            (last[0], last[1], _BACKFILL_ROWS)).fetchone()
        last = (str(row[1]), int(row[2])) if row is not None else None


class _Holes:
    """Placeholders for h, prev and seq, drawn once a sink: random, so no record's own text holds them."""

    __slots__ = ("h", "p", "s")

    def __init__(self) -> None:
        self.h = f'"h":"{secrets.token_hex(32)}",'
        self.p = f'"prev":"{secrets.token_hex(32)}"'
        self.s = f'"seq":{secrets.randbelow(1 << 60) + (1 << 61)}'


def _template(kind: str, fields: Mapping[str, Any], ts_ns: int, holes: _Holes) -> str:
    """The record as the database completes it: its kind and its canonical line cut where h, prev and seq go.

    Six parts joined by U+001F: kind, A, B, C, D, R, where the line is A "h":"<h>", B <prev> C <seq> D
    and the hashed body (the line without h) is A B <prev> C <seq> D. The keys are sorted, so h comes
    before kind, prev and seq and is always followed by a comma. A record whose text held a placeholder
    or a U+001F (canonical JSON escapes every control character) fails to split: it is refused. R is the
    record's run id for the run index: "" when it has none (or not a string), "r" + the id, or "?" for an id
    holding U+001F (stored NULL: found by its text).
    """
    record = dict(fields)
    record.update(h=holes.h[5:-2], seq=int(holes.s[6:]), ts_ns=ts_ns, kind=kind, prev=holes.p[8:-1])
    line = canonical_bytes(record).decode("utf-8")
    if _SEP in line:
        raise ValueError("a record may not hold U+001F")
    a, rest = line.split(holes.h)
    b, rest = rest.split(holes.p)
    c, d = rest.split(holes.s)
    run_id = fields.get("run_id")
    run = ("r" + run_id if _SEP not in run_id else "?") if isinstance(run_id, str) else ""
    return _SEP.join((kind, a, b + '"prev":"', '"' + c + '"seq":', d, run))


class _Pending:
    """One append waiting for the writer thread: `done` is held until its result is set (a bare
    lock: the cheapest thing one thread can sleep on and another wake it from)."""

    __slots__ = ("done", "durable", "kind", "parts", "result")

    def __init__(self, kind: str, parts: str, durable: bool) -> None:
        self.kind, self.parts, self.durable = kind, parts, durable
        self.done = threading.Lock()
        self.done.acquire()
        self.result: AuditResult | None = None

    def wait(self, url: str) -> AuditResult:
        if not self.done.acquire(timeout=_APPEND_WAIT_S):
            return AuditResult(False, error=f"the audit log {url} did not answer within {_APPEND_WAIT_S:g} s")
        assert self.result is not None
        return self.result


class _Lane:
    """A connection and the thread that writes batches on it."""

    __slots__ = ("busy", "cond", "db", "last", "prepared", "thread", "want")

    def __init__(self, lock: threading.Lock, db: PgConnection) -> None:
        self.cond = threading.Condition(lock)
        self.db = db
        self.busy = False  # a batch is being written on it
        self.last = 1  # the size of its last batch: as many writers are probably about to append again
        self.want = 1  # queued appends that wake its thread (more while it lingers for a batch)
        self.prepared: psycopg.Connection[Any] | None = None  # the connection _STATEMENTS are prepared on
        self.thread: threading.Thread | None = None


class PostgresAuditLog:
    """An `AuditSink` appending to a hash chain in PostgreSQL (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        signing_key: KeySource | None = None,
        checkpoint_every: int = 1000,
        checkpoint_interval_s: float = 60.0,
        max_batch: int = 256,
    ) -> None:
        if checkpoint_every < 1 or checkpoint_interval_s <= 0:
            raise ValueError("checkpoint_every must be ≥ 1 and checkpoint_interval_s > 0")
        self._conninfo, self.name = _split(url)
        self._name_bytes = self.name.encode("utf-8")
        self.url = shown_url(url)
        self.path = None  # not a file: `proctor audit verify URL` reads it
        self._every = checkpoint_every
        self._interval = checkpoint_interval_s
        self._max_batch = max_batch
        self._key = load_private_key(signing_key) if signing_key is not None else None
        self.error: str | None = None
        self.closed = False
        self._queue: list[_Pending] = []
        self._lock = threading.Lock()
        self._overlap = 0.0  # when an append last found another in flight (monotonic)
        self._ckpt_lock = threading.Lock()
        self._holes = _Holes()
        # idle_in_transaction_session_timeout: a writer stopped, paused or cut off inside its checkpoint transaction
        # holds the log row's lock; the server ends that transaction after 5 s, under the other writers' 10 s
        # statement_timeout, so they wait for it instead of being refused for as long as it is stalled.
        settings = ("SET synchronous_commit = off", "SET statement_timeout = 10000", "SET client_encoding = 'UTF8'",
                    READ_COMMITTED, "SET idle_in_transaction_session_timeout = 5000")
        self._lanes = [_Lane(self._lock, PgConnection(self._conninfo, settings)) for _ in range(_LANES)]
        self._last_ckpt_time = time.monotonic()
        self._last_ckpt: int | None = None
        self._seq = 0
        self._writer_id = secrets.token_hex(12)
        try:
            conn = self._connection(self._lanes[0])
            ensure_schema(conn)
            with conn.transaction():
                conn.execute("SET LOCAL synchronous_commit = on")
                conn.execute(
                    "INSERT INTO proctor_audit_logs (name, log_id, head, redact_key) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT (name) DO NOTHING",
                    (self.name, secrets.token_hex(16), GENESIS, secrets.token_bytes(32)))
                conn.execute("INSERT INTO proctor_audit_writers (id) VALUES (%s)", (self._writer_id,))
            row = conn.execute("SELECT log_id, redact_key, seq, last_ckpt, ckpt_line FROM proctor_audit_logs "
                               "WHERE name = %s", (self.name,)).fetchone()
        except psycopg.Error as exc:
            self._drop(self._lanes[0])
            raise AuditError(f"cannot open the audit log {self.url} (log {self.name!r}): {why(exc)}") from None
        assert row is not None
        problem = self._signer_problem(row[4])
        if problem is not None:
            self._drop(self._lanes[0])
            raise AuditError(f"cannot open the audit log {self.url} (log {self.name!r}): {problem}")
        self.log_id, self._redaction_key = str(row[0]), bytes(row[1])
        self._seq, self._last_ckpt = int(row[2]), row[3]
        for i, lane in enumerate(self._lanes):
            lane.thread = threading.Thread(target=self._write_loop, args=(i,), name=f"proctor-audit-pg-{i}",
                                           daemon=True)
            lane.thread.start()
        ref = weakref.ref(self)
        self._at_exit = lambda: _close_if_alive(ref)
        atexit.register(self._at_exit)
        _OPEN.add(self)

    # -- the sink -------------------------------------------------------------------------

    def append(self, kind: str, fields: Mapping[str, Any], *, durable: bool = True) -> AuditResult:
        """Append one record; with `durable` it returns only once the record's commit is flushed."""
        problem = self._refuse(kind, fields)
        if problem is not None:
            return AuditResult(False, error=problem)
        try:
            parts = _template(kind, fields, time.time_ns(), self._holes)
        except (TypeError, ValueError, RecursionError) as exc:
            return AuditResult(False, error=f"cannot encode the {kind} record: {exc}")
        item = _Pending(kind, parts, durable)
        lane = self._lanes[0]
        with self._lock:
            if self.closed:
                return AuditResult(False, error=f"audit log {self.url} is closed")
            now = time.monotonic()
            idle = not self._queue and not any(other.busy for other in self._lanes)
            if not idle:
                self._overlap = now
            inline = idle and now - self._overlap > _SOLO_S
            if inline:
                lane.busy = True  # this thread writes on the first lane; its writer thread waits
            else:
                self._queue.append(item)
                self._wake()
        if inline:
            try:
                self._run(lane, [item])
            finally:
                with self._lock:
                    lane.busy = False
                    lane.cond.notify_all()  # its writer thread (appends queued meanwhile) and close()
        return item.wait(self.url)

    def _wake(self) -> None:
        """Wake the first free lane if the queue is as long as it waits for (called holding _lock)."""
        for lane in self._lanes:
            if not lane.busy:
                if len(self._queue) >= lane.want:
                    lane.cond.notify()
                return

    def _refuse(self, kind: str, fields: Mapping[str, Any]) -> str | None:
        if self.closed:
            return f"audit log {self.url} is closed"
        return append_problem(kind, fields)

    def key_for(self, purpose: str) -> bytes:
        """This sink's secret derived for `purpose` (`AuditSink.key_for`)."""
        return derive_key(self._redaction_key, purpose)

    def run_records(self, run_id: str) -> list[dict[str, Any]]:
        """Every record of run `run_id` in this log, in order (`AuditReader`), on a connection of its own.

        Read through the index on the records' run_id (what the run's records cost, however many other runs the
        log holds), plus the rows whose run_id is not known (written before the column existed and not filled in
        yet), searched by text."""
        needle = '"run_id":' + canonical_bytes(run_id).decode("utf-8")
        try:
            with psycopg.connect(self._conninfo, connect_timeout=5, autocommit=True) as conn:
                rows = conn.execute("SELECT seq, line FROM proctor_audit_records WHERE log = %s AND run_id = %s "
                                    "UNION ALL SELECT seq, line FROM proctor_audit_records WHERE log = %s AND "
                                    "run_id IS NULL AND strpos(line, %s) > 0 ORDER BY 1",
                                    (self.name, run_id, self.name, needle)).fetchall()
        except psycopg.Error as exc:
            raise AuditError(f"cannot read the audit log {self.url}: {why(exc)}") from None
        out: list[dict[str, Any]] = []
        for _, line in rows:
            rec = json.loads(line)
            if isinstance(rec, dict) and rec.get("run_id") == run_id:
                out.append(rec)
        return out

    def redact(self, args: Mapping[str, Any], fields: Sequence[str]) -> Redacted:
        """Replace `fields` of `args` by HMAC digests keyed with the log's redaction key (kept in the database)."""
        return redact_args(args, fields, self._redaction_key)

    @property
    def connections(self) -> int:
        """Connections this sink has open: one while its appends come one at a time, two while they overlap."""
        return sum(1 for lane in self._lanes if lane.db.is_open)

    @property
    def seq(self) -> int:
        """The seq after this writer's last append (other writers may have appended since)."""
        return self._seq

    def checkpoint(self) -> AuditResult:
        """Write a signed checkpoint over the whole chain now (also every N records, T seconds and on close)."""
        item = _Pending("checkpoint", "", True)
        with self._lock:
            if self.closed:
                return AuditResult(False, error=f"audit log {self.url} is closed")
            self._queue.append(item)
            self._wake()
        return item.wait(self.url)

    def close(self) -> None:
        """Seal the chain with a checkpoint unless its last record is one; stop the writer; disconnect."""
        with self._lock:
            if self.closed:
                return
        self.checkpoint_if_unsealed()
        with self._lock:
            self.closed = True
            for lane in self._lanes:
                lane.cond.notify()
        for lane in self._lanes:
            if lane.thread is not None:
                lane.thread.join(timeout=30)
        with self._lock:
            while self._lanes[0].busy:  # an append writing its record itself
                self._lanes[0].cond.wait(1.0)
        try:
            self._connection(self._lanes[0]).execute("DELETE FROM proctor_audit_writers WHERE id = %s",
                                                     (self._writer_id,))
        except psycopg.Error:
            pass  # a stale writer row is harmless
        for lane in self._lanes:
            self._drop(lane)
        atexit.unregister(self._at_exit)

    def checkpoint_if_unsealed(self) -> None:
        """Checkpoint when records follow the chain's last checkpoint (what `close` does)."""
        item = _Pending("seal", "", True)
        with self._lock:
            self._queue.append(item)
            self._wake()
        item.wait(self.url)

    def __enter__(self) -> PostgresAuditLog:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    @staticmethod
    def _after_fork_in_child() -> None:
        """A forked child has the parent's sink without its writer thread (appends would wait for ever)
        and with the parent's writer id: each is closed in the child, so its appends are refused at once
        and its exit neither waits nor removes the parent's writer row. The child opens its own sink."""
        for log in list(_OPEN):
            PostgresAuditLog._closed_in_child(log)

    def _closed_in_child(self) -> None:
        self._lock = threading.Lock()
        for lane in self._lanes:
            lane.cond, lane.busy = threading.Condition(self._lock), False
        self._queue = []
        self.closed = True
        atexit.unregister(self._at_exit)

    # Once per process, when the class is made (at fork, not per append); a staticmethod is callable here.
    os.register_at_fork(after_in_child=_after_fork_in_child)

    def __repr__(self) -> str:
        return f"PostgresAuditLog({self.url!r}, log={self.name!r}, {'closed' if self.closed else 'open'})"

    # -- the writer thread ----------------------------------------------------------------

    def _connection(self, lane: _Lane) -> psycopg.Connection[Any]:
        return lane.db.get()

    def _drop(self, lane: _Lane) -> None:
        lane.db.drop()
        lane.prepared = None

    def _write_loop(self, index: int) -> None:
        lane, earlier = self._lanes[index], self._lanes[:index]
        while True:
            with self._lock:
                lane.want = 1
                # A lane takes work only while every lane before it is busy (the first: always).
                while not self._queue or lane.busy or any(not e.busy for e in earlier):
                    if self.closed and not self._queue:
                        return
                    lane.cond.wait()
                # Group commit: give the writers of the last batch a moment (at most _LINGER_S) to queue
                # their next records, so one flush carries them all instead of one each. Only the append
                # that completes the batch wakes this thread (not each one).
                want = lane.want = min(lane.last, self._max_batch)
                deadline = time.monotonic() + _LINGER_S
                while len(self._queue) < want and not self.closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    lane.cond.wait(left)
                lane.want = 1 << 30  # busy: no append needs to wake it
                if not self._queue or lane.busy:
                    continue  # another lane took them
                batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
                lane.last, lane.busy = len(batch), True
                self._wake()  # appends left over, if any, go to the next free lane
            try:
                self._run(lane, batch)
            finally:
                with self._lock:
                    lane.busy = False
                    if self.closed:
                        for other in self._lanes:
                            other.cond.notify()

    def _run(self, lane: _Lane, batch: list[_Pending]) -> None:
        """Write `batch` (records, checkpoints, seals) on `lane`, set each result, wake each waiter."""
        records = [p for p in batch if p.kind not in ("checkpoint", "seal")]
        try:
            if records:
                self._write(lane, records)
            for p in batch:
                if p.kind == "checkpoint" or (p.kind == "seal" and self._unsealed(lane)):
                    p.result = self._checkpoint(lane)
                elif p.kind == "seal":
                    p.result = AuditResult(True, seq=self._last_ckpt)
            if self._due() and self._ckpt_lock.acquire(blocking=False):  # one lane checkpoints at a time
                try:
                    if self._due():
                        self._checkpoint(lane)
                finally:
                    self._ckpt_lock.release()
        except psycopg.Error as exc:
            self._drop(lane)
            failure = AuditResult(False, error=f"the audit log {self.url} could not record it: {why(exc)}")
            for p in batch:
                p.result = p.result or failure
        except Exception as exc:  # noqa: BLE001 - never leave a writer waiting
            failure = AuditResult(False, error=f"the audit log {self.url} failed: {exc!r}")
            for p in batch:
                p.result = p.result or failure
        for p in batch:
            p.done.release()

    def _write(self, lane: _Lane, records: list[_Pending]) -> None:
        recs = _SEP.join([p.parts for p in records]).encode("utf-8")
        durable = any(p.durable for p in records)
        first, count, last = self._exec(lane, _STATEMENTS[durable][0], recs).split(" ")
        seq = int(first)
        if int(count) != len(records):
            raise AuditError(f"audit log {self.url}: {count} records appended of {len(records)} sent")
        for i, p in enumerate(records):
            p.result = AuditResult(True, seq=seq + i)
        if seq + len(records) > self._seq:  # the other lane's batch may have landed after this one
            self._seq, self._last_ckpt = seq + len(records), int(last) if last else None

    def _exec(self, lane: _Lane, statement: bytes, recs: bytes) -> str:
        """Run one of _STATEMENTS (prepared on first use on each connection) with the log's name and `recs`."""
        conn = self._connection(lane)
        pg = conn.pgconn
        deadline = time.monotonic() + _ANSWER_S
        if lane.prepared is not conn:
            for name, sql in _STATEMENTS:
                pg.send_prepare(name, sql)
                _check(_answer(pg, deadline))
            lane.prepared = conn
        pg.send_query_prepared(statement, [self._name_bytes, recs])
        result = _check(_answer(pg, deadline))
        value = result.get_value(0, 0)
        if value is None:
            raise AuditError(f"audit log {self.url}: the append returned nothing")
        return bytes(value).decode("ascii")

    def _unsealed(self, lane: _Lane) -> bool:
        row = self._connection(lane).execute("SELECT seq, last_ckpt FROM proctor_audit_logs WHERE name = %s",
                                         (self.name,)).fetchone()
        return row is not None and row[0] > 0 and (row[1] is None or row[1] != row[0] - 1)

    def _due(self) -> bool:
        since = self._seq - (self._last_ckpt + 1 if self._last_ckpt is not None else 0)
        return since >= self._every or (since > 0 and time.monotonic() - self._last_ckpt_time >= self._interval)

    def _signer_problem(self, ckpt_line: str | None) -> str | None:
        """Why this writer must not checkpoint a chain whose last checkpoint `ckpt_line` another key signed (one
        unsigned, or signed by another key, would make `verify --pubkey` refuse the whole log for good)."""
        try:
            signed = json.loads(ckpt_line).get("key_id") if ckpt_line else None
        except (ValueError, AttributeError):  # not ours to judge here: verify reports a broken checkpoint
            return None
        mine = key_id(self._key) if self._key is not None else None
        if signed is None or signed == mine:
            return None
        if mine is None:
            return (f"its checkpoints are signed by {signed} and this writer has no signing key: give it the "
                    "fleet's key (--audit-key, PROCTOR_AUDIT_KEY)")
        return f"its checkpoints are signed by {signed} and this writer's key is {mine}: use the fleet's one key"

    def _checkpoint(self, lane: _Lane) -> AuditResult:
        """Lock the chain, extend the Merkle frontier to its head, sign, append the checkpoint — one transaction."""
        conn = self._connection(lane)
        with conn.transaction():
            conn.execute("SET LOCAL synchronous_commit = on")
            row = conn.execute("SELECT seq, head, frontier_size, frontier, ckpt_line FROM proctor_audit_logs "
                               "WHERE name = %s FOR UPDATE", (self.name,)).fetchone()
            assert row is not None
            problem = self._signer_problem(row[4])  # a writer with another key opened at the same time as this one
            if problem is not None:
                raise AuditError(f"audit log {self.url}: no checkpoint written: {problem}")
            size, head, fsize, nodes = int(row[0]), str(row[1]), int(row[2]), list(row[3])
            frontier = MerkleFrontier.restored([bytes.fromhex(n) for n in nodes], fsize)
            hashes = conn.execute("SELECT h FROM proctor_audit_records WHERE log = %s AND seq >= %s ORDER BY seq",
                                  (self.name, fsize)).fetchall()
            frontier.extend([bytes.fromhex(h) for (h,) in hashes])
            if frontier.size != size:
                raise AuditError(f"audit log {self.url}: {size} records in the head row but "
                                 f"{frontier.size} in the table")
            root = frontier.root_hex()
            ts_ns = time.time_ns()
            fields: dict[str, Any] = {"log": self.log_id, "size": size, "head": head, "root": root,
                                      "key_id": None, "pub": None, "sig": None}
            if self._key is not None:
                statement = checkpoint_statement(self.log_id, size, head, root, ts_ns)
                fields.update(key_id=key_id(self._key), pub=public_raw(self._key.public_key()).hex(),
                              sig=self._key.sign(statement).hex())
            row = conn.execute("SELECT proctor_audit_append_runs(%s, %s)",
                               (self.name, _template("checkpoint", fields, ts_ns, self._holes))).fetchone()
            assert row is not None
            seq = int(row[0].split(" ")[0])
            line = conn.execute("SELECT line FROM proctor_audit_records WHERE log = %s AND seq = %s",
                                (self.name, seq)).fetchone()
            conn.execute("UPDATE proctor_audit_logs SET frontier_size = %s, frontier = %s, ckpt_line = %s "
                         "WHERE name = %s", (size, [n.hex() for n in frontier.nodes], line[0] if line else None,
                                             self.name))
        self._last_ckpt, self._seq = int(seq), int(seq) + 1
        self._last_ckpt_time = time.monotonic()
        return AuditResult(True, seq=int(seq))


def _answer(pg: pq.abc.PGconn, deadline: float) -> pq.abc.PGresult:
    """The result of the statement just sent on `pg` (nonblocking, as psycopg leaves it), waiting at most until
    `deadline`: a server that stopped answering (frozen, paused, cut off without a reset) fails the batch
    instead of blocking its appends for ever — the server's statement_timeout cannot fire then."""
    fd = pg.socket
    while pg.flush():
        _ready(fd, select.POLLOUT, deadline)
    results = []
    while True:
        while pg.is_busy():  # get_result would block
            _ready(fd, select.POLLIN, deadline)
            pg.consume_input()
        result = pg.get_result()
        if result is None:  # the statement is done
            break
        results.append(result)
    if not results:
        raise psycopg.OperationalError("PostgreSQL returned no result")
    failed = [r for r in results if r.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)]
    return failed[0] if failed else results[0]


def _ready(fd: int, events: int, deadline: float) -> None:
    poller = select.poll()
    poller.register(fd, events | select.POLLERR | select.POLLHUP)
    left = deadline - time.monotonic()
    if left <= 0 or not poller.poll(left * 1000):
        raise psycopg.OperationalError(f"PostgreSQL did not answer within {_ANSWER_S:g} s")


def _check(result: pq.abc.PGresult) -> pq.abc.PGresult:
    """`result` if the statement succeeded, else the psycopg error PostgreSQL reported."""
    if result.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
        raise psycopg.errors.error_from_result(result, encoding="utf-8")
    return result


#: Every PostgresAuditLog of this process, so that a forked child stops using its parent's (at fork).
_OPEN: weakref.WeakSet[PostgresAuditLog] = weakref.WeakSet()


def _close_if_alive(ref: weakref.ReferenceType[PostgresAuditLog]) -> None:
    log = ref()
    if log is not None:
        log.close()


# -- reading ---------------------------------------------------------------------------------


def export_jsonl(url: str, out: IO[bytes], *, side_file: str | os.PathLike[str] | None = None) -> int:
    """Write the log's records as JSON Lines to `out` (what the file verifier reads); return how many.

    With `side_file`, also write the last checkpoint there, as the file log keeps it beside
    itself (``LOG.checkpoint``), so a cut tail is detected the same way.
    """
    conninfo, name = _split(url)
    count = 0
    try:
        with psycopg.connect(conninfo, connect_timeout=5, autocommit=True) as conn:
            exists = conn.execute("SELECT to_regclass('proctor_audit_logs') IS NOT NULL").fetchone()
            row = (conn.execute("SELECT ckpt_line FROM proctor_audit_logs WHERE name = %s", (name,)).fetchone()
                   if exists and exists[0] else None)
            if row is None:
                raise AuditError(f"{shown_url(url)}: no audit log named {name!r} in this database")
            # One snapshot: rows appended meanwhile by live writers are not half-read.
            with conn.transaction(), conn.cursor(name="proctor_export") as cur:
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                row = conn.execute("SELECT ckpt_line FROM proctor_audit_logs WHERE name = %s", (name,)).fetchone()
                cur.itersize = 5000
                cur.execute("SELECT line FROM proctor_audit_records WHERE log = %s ORDER BY seq", (name,))
                for (line,) in cur:
                    out.write(line.encode("utf-8") + b"\n")
                    count += 1
    except psycopg.Error as exc:
        raise AuditError(f"cannot read the audit log {shown_url(url)}: {why(exc)}") from None
    if side_file is not None and row is not None and row[0] is not None:
        Path(side_file).write_bytes(row[0].encode("utf-8") + b"\n")
    return count


def redaction_secret(url: str) -> bytes:
    """The log's secret (what `PostgresAuditLog.key_for` derives its keys from), read without appending."""
    conninfo, name = _split(url)
    try:
        with psycopg.connect(conninfo, connect_timeout=5, autocommit=True) as conn:
            exists = conn.execute("SELECT to_regclass('proctor_audit_logs') IS NOT NULL").fetchone()
            row = (conn.execute("SELECT redact_key FROM proctor_audit_logs WHERE name = %s", (name,)).fetchone()
                   if exists and exists[0] else None)
    except psycopg.Error as exc:
        raise AuditError(f"cannot read the audit log {shown_url(url)}: {why(exc)}") from None
    if row is None:
        raise AuditError(f"{shown_url(url)}: no audit log named {name!r} in this database")
    return bytes(row[0])


def verify_postgres(url: str, **options: Any) -> VerifyReport:
    """Verify a PostgreSQL audit log: exported as the file log would be, then checked by the same verifier.

    Options are `verify`'s (pubkey, trusted_checkpoint, side_file, workers, progress); the
    checkpoint kept in the log's row plays the side file's part.
    """
    with tempfile.TemporaryDirectory(prefix="proctor-verify-") as tmp:
        path = Path(tmp) / "audit.jsonl"
        with path.open("wb") as out:
            export_jsonl(url, out, side_file=side_file_path(path) if options.get("side_file", True) else None)
        report = verify(path, **options)
    report.path = shown_url(url)
    if report.side_file is not None:
        report.side_file = f"{shown_url(url)} (checkpoint kept in proctor_audit_logs)"
    return report
