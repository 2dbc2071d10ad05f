"""Fixtures: a real Redis per test that needs one, one real PostgreSQL for the session (tests/fleet's own)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fleet"))
from fleet_fixtures import postgres_server, redis_server

__all__ = ["postgres_server", "redis_server"]
