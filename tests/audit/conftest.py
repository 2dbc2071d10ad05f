"""Fixtures of the audit tests."""

from __future__ import annotations

import os

import pytest

from proctor.audit.log import NATIVE_GROUP_COMMIT


@pytest.fixture(params=["native", "python"])
def group_commit_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """An environment for a crash harness: AuditLog's native syncer, or its pure-Python group commit."""
    if request.param == "native" and not NATIVE_GROUP_COMMIT:
        pytest.fail("proctor.audit._syncer is not built: reinstall proctor (pip install -e .) with a C compiler")
    return {**os.environ, "PROCTOR_GROUP_COMMIT": str(request.param)}
