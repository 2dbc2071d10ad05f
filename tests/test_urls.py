"""Connection URLs in messages never carry a password."""

from __future__ import annotations

import pytest

from proctor.urls import shown_url


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://app:s3cret@db.internal:5432/proctor", "postgresql://app:***@db.internal:5432/proctor"),
    ("redis://:s3cret@cache/0", "redis://:***@cache/0"),
    ("postgresql://app@db/proctor?password=s3cret&sslmode=require",
     "postgresql://app@db/proctor?password=***&sslmode=require"),
    ("postgresql://app:a@[::1]:5432/db?PassWord=b", "postgresql://app:***@[::1]:5432/db?PassWord=***"),
    ("postgresql://app@db/proctor?log=team", "postgresql://app@db/proctor?log=team"),
    ("/var/log/proctor/audit.jsonl", "/var/log/proctor/audit.jsonl"),
])
def test_passwords_are_masked_wherever_the_url_holds_them(url: str, shown: str) -> None:
    """The user-info password and a libpq-style password parameter both become ***."""
    assert shown_url(url) == shown
    assert "s3cret" not in shown_url(url)


def test_query_can_be_left_out() -> None:
    """query=False drops the query (the Redis ledger's own options) along with any secret in it."""
    assert shown_url("redis://u:p@h:6379/0?lease=15s&password=x", query=False) == "redis://u:***@h:6379/0"


def test_the_store_and_the_audit_sink_never_echo_a_password() -> None:
    """A PostgreSQL store or audit log that cannot be reached names the URL with its password masked."""
    from proctor.errors import ProctorError
    from proctor.store import RunStore

    url = "postgresql://app:s3cret@127.0.0.1:9/db?password=s3cret&connect_timeout=1"
    with pytest.raises(ProctorError) as caught:
        RunStore.open(url)
    assert "s3cret" not in str(caught.value) and "***" in str(caught.value)
    from proctor.audit.postgres import PostgresAuditLog, verify_postgres

    for attempt in (lambda: PostgresAuditLog(url), lambda: verify_postgres(url)):
        with pytest.raises(ProctorError) as caught:
            attempt()
        assert "s3cret" not in str(caught.value)
