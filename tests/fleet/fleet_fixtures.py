"""The fixtures that start the fleet's real servers (`fleet_engines`), shared by every conftest that needs them
(tests/fleet, tests/ops): import them into a conftest to offer them there."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_engines import PostgresServer, RedisServer

__all__ = ["postgres_server", "redis_server"]


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
    """One PostgreSQL cluster (run as nobody) for every test of the session: tests name their own audit logs
    and schemas, and lift the halts they set."""
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()
