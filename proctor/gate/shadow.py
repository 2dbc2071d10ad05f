"""A shadow policy: a candidate decides every call beside the enforced one, and never acts.

`Gate(policy, shadow=candidate)` (or `--shadow P` on the command line) admits each call a
second time, with the candidate, through the same `proctor.policy.admission.admit` and
on the same inputs (tool, arguments, run history, `seen`, provenance); its budgets are
counted on a ledger of its own per run, fed with the calls that really went on. Where the
two verdicts differ — outcome, or the budget that refused — the gate's recorder writes a
`shadow_decision` record with both decisions and their rules, the call's span gets a
`proctor.shadow_decision` event, and the `proctor.shadow.disagreements` counter goes up.
Nothing the shadow does changes a call: a candidate that raises is logged and skipped.

The shadow's budgets wider than a run (`per: principal`, `global`) count this process's
calls only: a shadow observes, and a shared pool must not be charged by a policy that
is not enforced.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proctor.errors import BudgetExceeded
from proctor.gate.call import InFlight
from proctor.gate.recorder import Recorder, safely
from proctor.ledger.memory import MemoryLedger
from proctor.policy.admission import Admission, admit
from proctor.telemetry import metrics
from proctor.telemetry import semconv as sc
from proctor.telemetry.logging import get_logger

if TYPE_CHECKING:
    from proctor.gate.gate import PolicyLike
    from proctor.gate.run import Ledger
    from proctor.tools import Tool

__all__ = ["Shadow", "Verdict"]

log = get_logger("proctor.gate")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a policy made of a call before any human: allow, require_approval or deny (by which budget)."""

    outcome: str
    rules: tuple[str, ...]
    reason: str
    budget: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"decision": self.outcome, "rules": list(self.rules), "reason": self.reason, "budget": self.budget}


def verdict_of(adm: Admission) -> Verdict:
    """The verdict of an admission, before budgets."""
    if adm.decision is not None and adm.stage in ("policy", "decided"):
        return Verdict(adm.decision.outcome, adm.decision.rules, adm.decision.reason)
    rules = adm.decision.rules if adm.decision is not None else ()
    return Verdict("deny", rules, str(adm.refusal))


class Shadow:
    """One gate's shadow policy and the per-run ledgers of its budgets."""

    def __init__(self, policy: PolicyLike, recorder: Recorder) -> None:
        self.policy = policy
        self.recorder = recorder
        self._ledgers: dict[str, Ledger] = {}
        self._lock = threading.Lock()

    def admit(self, p: InFlight, args: Mapping[str, Any] | None, tools: Mapping[str, Tool],
              expected: Tool | None) -> Verdict | None:
        """The candidate's verdict on call `p`, its budgets reserved (None if the candidate failed)."""
        try:
            adm = admit(self.policy, p.name, args, tools=tools, run=p.ctx, layers=p.ctx.layers, expected=expected)
            verdict = verdict_of(adm)
            if adm.stage == "decided":
                ledger = self._ledger(p)
                try:
                    p.shadow = (ledger, ledger.reserve(p.name, adm.side_effect, adm.cost))
                except BudgetExceeded as exc:
                    return Verdict("deny", verdict.rules, str(exc), exc.budget)
            return verdict
        except Exception as exc:  # noqa: BLE001 - the shadow never changes a call
            log.error("shadow_policy_failed", tool=p.name, error=repr(exc))
            return None

    def compare(self, p: InFlight, enforced: Verdict, shadow: Verdict | None, *, went_on: bool) -> None:
        """Record a disagreement between the enforced verdict and the shadow's, and count the call on the
        shadow's budgets if it `went_on` past the enforced ones (else give its reservation back)."""
        if p.shadow is not None:
            ledger, reservation = p.shadow
            p.shadow = None
            try:
                if went_on:
                    ledger.settle(reservation, duration_ns=0)
                else:
                    ledger.release(reservation)
            except Exception as exc:  # noqa: BLE001 - the shadow never changes a call
                log.error("shadow_policy_failed", tool=p.name, error=repr(exc))
        if shadow is None or (shadow.outcome, shadow.budget) == (enforced.outcome, enforced.budget):
            return
        self.recorder.about(p, "shadow_decision", {
            "run_id": p.ctx.info.id, "call_id": p.call_id, "tool": p.name, "enforced": enforced.as_dict(),
            "shadow": shadow.as_dict(), "policy_sha256": p.policy_sha256, "shadow_sha256": self.policy.sha256})
        safely(p.span.event, sc.SHADOW_DECISION_EVENT, {
            sc.PROCTOR_DECISION: enforced.outcome, "proctor.shadow.decision": shadow.outcome,
            "proctor.shadow.rules": ",".join(shadow.rules), "proctor.shadow.policy_sha256": self.policy.sha256})
        metrics.record_shadow(tool=p.name, enforced=enforced.outcome, shadow=shadow.outcome)

    def finished(self, run_id: str) -> None:
        """Forget the ledger of a run that ended."""
        with self._lock:
            self._ledgers.pop(run_id, None)

    def _ledger(self, p: InFlight) -> Ledger:
        run_id = p.ctx.info.id
        with self._lock:
            ledger = self._ledgers.get(run_id)
            if ledger is None:
                ledger = self._ledgers[run_id] = self.policy.new_ledger(p.ctx.info, MemoryLedger())
            return ledger
