"""The escape corpus again, each program arriving through smolagents' executor interface (GovernedExecutor)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import test_interpreter_escapes as escapes
from conftest import POLICY, TOOLS
from test_interpreter_escapes import CORPUS, MODES, SANDBOX_ONLY, Host, _attempt

from proctor.gate import Gate
from proctor.integrations.smolagents import GovernedExecutor
from proctor.interpreter import ExecutionResult
from proctor.policy import Policy
from proctor.testing import InMemoryAudit

host = escapes.host  # the same files, secret, canary and listening socket the corpus aims at


class ThroughExecutor:
    """Runs a program the way smolagents' CodeAgent does (``executor(code)``) and hands back its full result."""

    def __init__(self, executor: GovernedExecutor) -> None:
        self.executor = executor
        self.timeout = executor.interpreter.timeout

    def run(self, code: str) -> ExecutionResult:
        try:
            self.executor(code)
        except Exception:  # smolagents turns it into an observation; the result says what happened
            pass
        assert self.executor.last_result is not None
        return self.executor.last_result


@pytest.fixture(scope="module", params=MODES)
def setup(request: pytest.FixtureRequest, host: Host) -> Iterator[tuple[ThroughExecutor, InMemoryAudit, str]]:
    sandbox, imports = request.param
    audit = InMemoryAudit()
    gate = Gate(Policy.from_dict(POLICY), audit=audit, tools=TOOLS)
    executor = GovernedExecutor(gate, timeout=1.5, sandbox=sandbox, authorized_imports=imports)
    executor.send_tools({t.name: t for t in TOOLS})
    try:
        yield ThroughExecutor(executor), audit, "star" if imports else "default"
    finally:
        executor.cleanup()


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_escape_attempt_through_the_executor_leaves_the_host_untouched(
        setup: tuple[ThroughExecutor, InMemoryAudit, str], host: Host, name: str) -> None:
    """Files, network, environment and real tools of the host are untouched; every tool run passed the gate."""
    _attempt(*setup[:2], host, name, CORPUS[name])  # type: ignore[arg-type]


@pytest.mark.parametrize("setup", [MODES[2]], indirect=True)
@pytest.mark.parametrize("name", sorted(SANDBOX_ONLY))
def test_signals_through_the_executor_stay_in_the_sandbox(
        setup: tuple[ThroughExecutor, InMemoryAudit, str], host: Host, name: str) -> None:
    """kill(-1), killpg and killing the parent, with os authorized: only the sandbox dies."""
    _attempt(*setup[:2], host, name, SANDBOX_ONLY[name])  # type: ignore[arg-type]
