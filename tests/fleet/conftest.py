"""Fixtures: a real Redis per test that needs one, one real PostgreSQL for the session."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_engines import PostgresServer, RedisServer


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh redis-server on a Unix socket, stopped after the test."""
    with tempfile.TemporaryDirectory(prefix="proctor-redis-") as root:
        server = RedisServer(Path(root))
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL cluster (run as nobody) for every test of the session."""
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()
