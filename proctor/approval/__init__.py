"""Asking a human (or a program) whether a call may run.

- `ConsoleApprover` — a panel at the terminal; keys approve / deny / edit / grant.
- `WebhookApprover` — a signed POST to an ops service, polling while pending.
- `CallbackApprover` — a function of your program decides.
- `InboxApprover` — filed in the run store, answered from anywhere; the run suspends meanwhile.

Every approver answers with an `ApprovalDecision` bound to the exact call
(`approval_binding`); the wire format of the webhook is in docs/approvals.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import proctor._lazy as _lazy

if TYPE_CHECKING:
    from proctor.approval.base import (
        ApprovalDecision,
        ApprovalRequest,
        Approver,
        Grant,
        Verdict,
        approval_binding,
    )
    from proctor.approval.callback import ApprovalCallback, CallbackApprover
    from proctor.approval.console import ConsoleApprover
    from proctor.approval.inbox import InboxApprover
    from proctor.approval.spec import approver_from_spec
    from proctor.approval.webhook import WebhookApprover

__all__ = [
    "ApprovalCallback",
    "ApprovalDecision",
    "ApprovalRequest",
    "Approver",
    "CallbackApprover",
    "ConsoleApprover",
    "Grant",
    "InboxApprover",
    "Verdict",
    "WebhookApprover",
    "approval_binding",
    "approver_from_spec",
]

_lazy.install(__name__, {
    "ApprovalDecision": "proctor.approval.base",
    "ApprovalRequest": "proctor.approval.base",
    "Approver": "proctor.approval.base",
    "Grant": "proctor.approval.base",
    "Verdict": "proctor.approval.base",
    "approval_binding": "proctor.approval.base",
    "ApprovalCallback": "proctor.approval.callback",
    "CallbackApprover": "proctor.approval.callback",
    "ConsoleApprover": "proctor.approval.console",
    "InboxApprover": "proctor.approval.inbox",
    "approver_from_spec": "proctor.approval.spec",
    "WebhookApprover": "proctor.approval.webhook",
})
