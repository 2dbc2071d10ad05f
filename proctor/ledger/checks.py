"""The limit checks every shared ledger applies (the Redis ledger's Lua script mirrors them)."""

from __future__ import annotations

from proctor.ledger.base import Claim, _num

__all__ = ["refusal"]

#: Costs are compared with this slack, so that summed floating-point costs refuse no call wrongly.
EPSILON = 1e-9


def refusal(claim: Claim, calls: int, cost: float, wall_ns: int, add_cost: float) -> str | None:
    """Why one more call of cost `add_cost` would pass the claim's limits ("'name' exhausted: …"), or None."""
    if claim.calls is not None and calls + 1 > claim.calls:
        problem = f"{calls} of {claim.calls} calls used"
    elif claim.cost is not None and cost + add_cost > claim.cost + EPSILON:
        problem = f"cost {_num(round(cost, 9))} used + {_num(add_cost)} would pass the limit of {_num(claim.cost)}"
    elif claim.wall_ns is not None and wall_ns >= claim.wall_ns:
        problem = f"wall time {wall_ns / 1e9:.1f}s of {claim.wall_ns / 1e9:g}s used"
    else:
        return None
    return f"'{claim.budget}' exhausted{' ' + claim.scope if claim.scope else ''}: {problem}"
