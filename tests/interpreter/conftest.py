"""Shared fixtures for the interpreter tests: counted tools, a real gate, interpreters per isolation."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog

from proctor.gate import Gate
from proctor.interpreter import Interpreter
from proctor.interpreter.sandbox import bwrap_status
from proctor.policy import Policy
from proctor.testing import InMemoryAudit
from proctor.tools import tool

#: How many times each real tool function actually ran (across the whole session).
REAL_RUNS: Counter[str] = Counter()
_lock = threading.Lock()


def _ran(name: str) -> None:
    with _lock:
        REAL_RUNS[name] += 1


@tool(side_effect="read")
def lookup(order: str) -> str:
    """Look an order up.

    Args:
        order: Order id.
    """
    _ran("lookup")
    return f"order {order}: shipped"


@tool(side_effect="destructive", cost=10)
def charge(amount: int = 5) -> str:
    """Charge the customer's card.

    Args:
        amount: Amount in euros.
    """
    _ran("charge")
    return f"charged {amount}"


@tool(side_effect="destructive")
def wipe(target: str) -> str:
    """Wipe something (always denied by the test policy).

    Args:
        target: What to wipe.
    """
    _ran("wipe")
    return "wiped"


@tool(side_effect="read")
def slow(seconds: float) -> str:
    """Sleep on the host, then answer.

    Args:
        seconds: How long.
    """
    _ran("slow")
    time.sleep(seconds)
    return "slept"


@tool(side_effect="read")
def blob(kind: str) -> Any:
    """Return a value of some shape.

    Args:
        kind: Which shape.
    """
    _ran("blob")
    if kind == "object":
        return object()
    return {"bytes": b"\x00\xff", "tuple": (1, 2), "set": {3}, "$tuple": "escaped", 1: "int key"}


TOOLS = [lookup, charge, wipe, slow, blob]
POLICY: dict[str, Any] = {
    "version": 1,
    "default": "deny",
    "budgets": [{"name": "one-charge", "match": {"tool": "charge"}, "limit": {"calls": 1}}],
    "rules": [
        {"name": "reads", "match": {"side_effect": ["none", "read"]}, "decision": "allow"},
        {"name": "charges", "match": {"tool": "charge"}, "decision": "allow"},
        {"name": "no-wipe", "match": {"tool": "wipe"}, "decision": "deny", "reason": "never wipe"},
    ],
}


@pytest.fixture(autouse=True)
def _quiet_logs() -> Iterator[None]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    yield
    structlog.reset_defaults()


def bwrap_usable() -> bool:
    return bwrap_status()[0]


# CI (.ci/run) installs bubblewrap and sets this: there the sandbox and escape tests must run, never skip.
if os.environ.get("PROCTOR_REQUIRE_BWRAP") == "1" and not bwrap_usable():
    raise RuntimeError(f"PROCTOR_REQUIRE_BWRAP=1 but bubblewrap is unusable here: {bwrap_status()[1]}")

needs_bwrap = pytest.mark.skipif(not bwrap_usable(), reason=f"bubblewrap unusable here: {bwrap_status()[1]}")
ISOLATIONS = [pytest.param("bwrap", marks=needs_bwrap), "process"]


@pytest.fixture
def audit() -> InMemoryAudit:
    return InMemoryAudit()


@pytest.fixture
def gate(audit: InMemoryAudit) -> Gate:
    return Gate(Policy.from_dict(POLICY), audit=audit, tools=TOOLS)


@pytest.fixture
def make(gate: Gate) -> Iterator[Callable[..., Interpreter]]:
    """Build interpreters on the test's gate; all are closed at the end."""
    made: list[Interpreter] = []

    def build(**kwargs: Any) -> Interpreter:
        kwargs.setdefault("timeout", 10)
        interp = Interpreter(kwargs.pop("tools", TOOLS), kwargs.pop("gate", gate), **kwargs)
        made.append(interp)
        return interp

    yield build
    for interp in made:
        interp.close()


@pytest.fixture(params=ISOLATIONS)
def py(request: pytest.FixtureRequest, make: Callable[..., Interpreter]) -> Interpreter:
    """One interpreter per isolation level (bwrap skipped only when it truly cannot run)."""
    return make(sandbox=request.param)
