"""A fleet member for the tests: makes N governed calls through a Gate on a shared ledger.

    python tests/fleet/fleet_worker.py LEDGER_URL COUNTER_FILE CALLS [HOLD_FILE]

Each call that runs appends one byte to COUNTER_FILE (O_APPEND: one write each, so many
processes can share it). With HOLD_FILE the tool first writes its pid there and then
blocks forever — the process holds its reservation until it is killed. Prints one JSON
line: how many calls ran, how many were refused by a budget, by an unreachable ledger (or its halts).
"""

from __future__ import annotations

import json
import os
import sys
import time

from proctor import Gate, Policy, tool
from proctor.errors import BudgetExceeded, LedgerUnavailable, ToolDenied
from proctor.halt import OUTAGE_ID

POLICY = {
    "version": 1,
    "default": "allow",
    "budgets": [{"name": "fleet-global", "per": "global", "limit": {"calls": 1000}}],
}


def main() -> int:
    url, counter, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
    hold = sys.argv[4] if len(sys.argv) > 4 else None
    pace = float(os.environ.get("FLEET_PACE_S", "0"))
    stop = os.environ.get("FLEET_STOP_FILE")  # with it: keep calling (up to CALLS) until this file appears

    @tool(side_effect="write")
    def bump() -> int:
        """Count one execution."""
        if hold:
            with open(hold, "a") as f:
                f.write(f"{os.getpid()}\n")
            while True:
                time.sleep(60)
        fd = os.open(counter, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)
        return 1

    gate = Gate(Policy.from_dict(POLICY), tools=[bump], ledger=url)
    ran = refused = unavailable = 0
    for _ in range(calls):
        if stop and os.path.exists(stop):
            break
        try:
            gate.call("bump")
            ran += 1
        except LedgerUnavailable:
            unavailable += 1
        except ToolDenied as exc:
            # The halts kept in that Redis cannot be read either (past their grace period, or never yet: a worker
            # started while Redis was down): the gate refuses as it does for the ledger, naming the outage.
            if f"halted by {OUTAGE_ID}:" not in str(exc):
                raise
            unavailable += 1
        except BudgetExceeded:
            refused += 1
        if pace:
            time.sleep(pace)
    print(json.dumps({"ran": ran, "refused": refused, "unavailable": unavailable}), flush=True)
    gate.ledger.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
