"""The in-memory ledger passes the SharedLedger conformance suite."""

from __future__ import annotations

import pytest
from ledger_conformance import LedgerConformance, MakeLedger

from proctor.ledger import MemoryLedger, SharedLedger


@pytest.fixture
def make_ledger() -> MakeLedger:
    """One MemoryLedger per test, whatever lease is asked for (its leases never expire)."""
    led = MemoryLedger()

    def make(lease_s: float) -> SharedLedger:
        return led

    return make


class TestMemoryLedger(LedgerConformance):
    """MemoryLedger keeps every promise of the protocol."""


def test_agents_and_the_cli_take_a_ledger() -> None:
    """CodeAgent(ledger=…) hands it to its gate; `proctor run --ledger URL` parses into the same argument."""
    import argparse

    from proctor import CodeAgent, Policy, ScriptedModel
    from proctor.cli.run import register

    shared = MemoryLedger()
    policy = Policy.from_dict({"version": 1, "default": "allow"})
    agent = CodeAgent([], ScriptedModel(["final_answer(1)"]), policy, ledger=shared)
    assert agent.gate.ledger is shared
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["run", "t", "--tools", "m", "--policy", "p.yaml", "--model", "x",
                              "--ledger", "redis://r:6379/0"])
    assert args.ledger == "redis://r:6379/0"
