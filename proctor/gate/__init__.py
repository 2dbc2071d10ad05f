"""The gate: the one door between generated code and real tools, and a call's whole life through it.

- `gate`: `Gate`, the steps every call walks (admission, budgets, approval, intent, the tool);
- `call`: the call in flight (`InFlight`) and what the gate returns for it (`CallOutcome`);
- `recorder`: the one writer of call records, span endings and every way a call ends;
- `journal`: a durable run's step journal, and a resumed step answered from it.

The decision itself is `proctor.policy.admission.admit`; the run a call belongs to is
`proctor.gate.run.RunContext`.
"""

from proctor.gate.call import CallOutcome, CallScope, agent_fields
from proctor.gate.gate import Gate, PolicyLike
from proctor.gate.run import RunContext

__all__ = ["CallOutcome", "CallScope", "Gate", "PolicyLike", "RunContext", "agent_fields"]
