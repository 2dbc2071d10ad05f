"""Fixtures: a real Redis per test that needs one, one real PostgreSQL for the session (`fleet_fixtures`)."""

from __future__ import annotations

from fleet_fixtures import postgres_server, redis_server

__all__ = ["postgres_server", "redis_server"]
