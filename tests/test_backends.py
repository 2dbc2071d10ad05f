"""proctor.backends: one resolver from a URL to a ledger, a run store or an audit sink, and one way to refuse."""

from __future__ import annotations

from pathlib import Path

import pytest

from proctor import Gate, Policy, backends
from proctor.audit.log import AuditLog
from proctor.audit.postgres import PostgresAuditLog
from proctor.errors import ConfigurationError, StoreError
from proctor.ledger import open_ledger
from proctor.ledger.memory import MemoryLedger
from proctor.ledger.redis import RedisLedger
from proctor.store.base import RunStore
from proctor.store.postgres import PostgresRunStore
from proctor.store.sqlite import SQLiteRunStore

ALLOW = Policy.from_dict({"version": 1, "default": "allow"})


@pytest.mark.parametrize(("kind", "url", "factory"), [
    ("ledger", "redis://127.0.0.1:6379/0", RedisLedger),
    ("ledger", "rediss://127.0.0.1:6380/0", RedisLedger),
    ("ledger", "unix:///run/redis.sock", RedisLedger),
    ("store", "sqlite:///runs.db", SQLiteRunStore),
    ("store", "runs.db", SQLiteRunStore),
    ("store", "postgresql://u@127.0.0.1/db", PostgresRunStore),
    ("store", "postgres://u@127.0.0.1/db", PostgresRunStore),
    ("audit", "audit.jsonl", AuditLog),
    ("audit", "postgresql://u@127.0.0.1/db?log=main", PostgresAuditLog),
    ("audit", "POSTGRES://u@127.0.0.1/db", PostgresAuditLog),
])
def test_each_scheme_resolves_to_its_backend(kind: backends.Kind, url: str, factory: object) -> None:
    assert backends.resolve(kind, url) is factory


@pytest.mark.parametrize(("kind", "error", "expected"), [
    ("ledger", ConfigurationError,
     "unknown ledger URL scheme 'mysql' in 'mysql://u:***@h/db': use local or redis://host:6379/0 "
     "(schemes: redis://, rediss://, unix://)"),
    ("store", StoreError,
     "unknown run store URL scheme 'mysql' in 'mysql://u:***@h/db': use sqlite:///PATH (or a path) or "
     "postgresql://… (schemes: postgres://, postgresql://, sqlite://)"),
    ("audit", ConfigurationError,
     "unknown audit log URL scheme 'mysql' in 'mysql://u:***@h/db': use a file path or postgresql://…?log=NAME "
     "(schemes: postgres://, postgresql://)"),
])
def test_an_unknown_scheme_is_refused_naming_the_supported_ones(kind: backends.Kind, error: type[Exception],
                                                                 expected: str) -> None:
    """One message for every kind: what was given (password hidden), what to write, the schemes it takes."""
    with pytest.raises(error) as raised:
        backends.resolve(kind, "mysql://u:hunter2@h/db")
    assert str(raised.value) == expected


def test_the_gate_opens_its_ledger_through_the_resolver() -> None:
    """Gate(ledger=URL) refuses an unknown scheme the same way, and takes the local ledger by name."""
    with pytest.raises(ConfigurationError, match=r"^unknown ledger URL scheme 'mysql' in 'mysql://h/db': use local"):
        Gate(ALLOW, ledger="mysql://h/db")
    with pytest.raises(ConfigurationError, match=r"^unknown ledger 'nowhere': use local or redis://host:6379/0$"):
        open_ledger("nowhere")
    assert isinstance(open_ledger("local"), MemoryLedger)


def test_a_run_store_opens_through_the_resolver(tmp_path: Path) -> None:
    store = RunStore.open(tmp_path / "runs.db")
    try:
        assert isinstance(store, SQLiteRunStore)
    finally:
        store.close()
    with pytest.raises(StoreError, match=r"^unknown run store URL scheme 'mysql'"):
        RunStore.open("mysql://h/db")
    with pytest.raises(StoreError, match="no run store given"):
        RunStore.open("")


def test_an_audit_sink_opens_through_the_resolver(tmp_path: Path) -> None:
    """A path is an AuditLog the caller owns; an unknown scheme is refused, not taken for a file name."""
    sink, where, owned = backends.load_audit(str(tmp_path / "audit.jsonl"))
    try:
        assert isinstance(sink, AuditLog) and owned and where == str(tmp_path / "audit.jsonl")
    finally:
        assert sink is not None
        sink.close()
    with pytest.raises(ConfigurationError, match=r"^unknown audit log URL scheme 'mysql'"):
        backends.load_audit("mysql://h/db")
    assert not (tmp_path / "mysql:").exists()


def test_a_registered_scheme_is_resolved(tmp_path: Path) -> None:
    """register_scheme (the run store's public hook) adds to the same table the resolver reads."""
    from proctor.store.base import register_scheme

    opened: list[str] = []

    def factory(url: str) -> RunStore:
        opened.append(url)
        return SQLiteRunStore(str(tmp_path / "other.db"))

    register_scheme("other", factory)
    try:
        store = RunStore.open("other://somewhere")
        store.close()
        assert opened == ["other://somewhere"]
    finally:
        backends.unregister("store", "other")


def test_the_default_audit_trail_is_named_by_the_environment(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`$PROCTOR_AUDIT` first, else the state directory: the one trail every command defaults to."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("PROCTOR_AUDIT", raising=False)
    assert backends.default_audit_path() == str(tmp_path / "state" / "proctor" / "audit.jsonl")
    monkeypatch.setenv("PROCTOR_AUDIT", "postgresql://u@127.0.0.1/db?log=fleet")
    assert backends.default_audit_path() == "postgresql://u@127.0.0.1/db?log=fleet"
    monkeypatch.delenv("PROCTOR_AUDIT")
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert backends.default_audit_path() == str(tmp_path / "home" / ".local" / "state" / "proctor" / "audit.jsonl")
