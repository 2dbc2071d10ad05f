"""Fixtures: a real Redis per test that needs one, one real PostgreSQL for the module (tests/fleet's engines)."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fleet"))
from fleet_engines import PostgresServer, RedisServer


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with tempfile.TemporaryDirectory(prefix="proctor-redis-") as root:
        server = RedisServer(Path(root))
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="module")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()
