"""What an approver is asked and what it answers.

An answer is bound to the exact call it approves: `binding` is
sha256(canonical [tool, redacted args, call id, policy sha256]) and the gate rejects an
answer whose binding differs, so an approval can never be replayed onto other
arguments, another call or a changed policy. The arguments are the redacted ones (each
redacted value an HMAC under the log's key): the binding is written to the audit log and
sent to webhooks, and a plain hash of a card number is reversed by brute force in seconds.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from proctor.calls import CallPosition, RunInfo, SideEffect
from proctor.canonical import canonical_sha256
from proctor.policy.approvers import ApproverRule, OsUser

if TYPE_CHECKING:
    from proctor.store.answerseal import AnswerCheck
    from proctor.store.base import RunStore

__all__ = [
    "ApprovalDecision",
    "ApprovalRequest",
    "Approver",
    "CheckingApprover",
    "Grant",
    "StoredApprover",
    "Verdict",
    "approval_binding",
]

Verdict = Literal["approve", "deny", "edit", "grant"]


def approval_binding(tool: str, args: Mapping[str, Any], call_id: str, policy_sha256: str) -> str:
    """The value an answer must echo to count for this call."""
    return canonical_sha256([tool, dict(args), call_id, policy_sha256])


@dataclass(frozen=True, slots=True)
class Grant:
    """"Approve this tool for the rest of the run", optionally only when arguments match.

    `args` maps an argument name to a glob (fnmatch) its string form must match. `approvers` are the
    `approvers:` specs the call it was given for required, `policy_sha256` the policy that decided it (both
    set by the gate, never taken from an answer; None: not known): the grant covers a later call only where
    that call requires no other approvers (`covers_approvers`), so a grant never answers a call another
    approver guards, and only under that policy (`covers_policy`): under a changed one it was never given.
    """

    tool: str
    args: Mapping[str, str] = field(default_factory=dict)
    approvers: tuple[ApproverRule, ...] | None = None
    policy_sha256: str | None = None

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"tool": self.tool, "args": dict(self.args)}
        if self.approvers is not None:
            data["approvers"] = [spec.as_dict() for spec in self.approvers]
        if self.policy_sha256 is not None:
            data["policy_sha256"] = self.policy_sha256
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Grant:
        """A grant as `as_dict` wrote it (a run's own record: the store's, checked against its seal)."""
        specs = data.get("approvers")
        approvers = (tuple(ApproverRule.from_dict(s) for s in specs if isinstance(s, Mapping))
                     if isinstance(specs, list) else None)
        sha = data.get("policy_sha256")
        return cls(str(data["tool"]), {str(k): str(v) for k, v in dict(data.get("args") or {}).items()}, approvers,
                   sha if isinstance(sha, str) else None)

    def covers_policy(self, policy_sha256: str) -> bool:
        """Whether the grant may answer a call decided by the policy `policy_sha256`: one the gate recorded is
        bound to the policy it was given under (under a changed one it answers nothing, and the call is asked
        about again, as a call's own answer is); one built in Python without a policy is not bound."""
        return self.policy_sha256 is None or self.policy_sha256 == policy_sha256

    def covers_approvers(self, needed: Sequence[ApproverRule]) -> bool:
        """Whether every spec in `needed` (a later call's `approvers:`) is one this grant's call required too:
        its giver was checked against each, so may answer that call. A spec's source is not compared (two rules
        may ask for the same approvers); a grant whose specs are not known covers only calls that need none."""
        given = {(s.groups, s.users, s.excluded) for s in self.approvers or ()}
        return all((s.groups, s.users, s.excluded) in given for s in needed)


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """One call waiting for a human. `args` are clear but for fields the policy hides from
    approvers (`hide_from_approvers`); `redacted_args` are redacted as in the audit log."""

    call_id: str
    tool: str
    side_effect: SideEffect
    args: Mapping[str, Any]
    rules: tuple[str, ...]
    reason: str
    policy_sha256: str
    budget: Mapping[str, Any]
    expires_at_ns: int
    binding: str
    run: RunInfo = field(default_factory=RunInfo)
    #: The arguments as the audit log holds them (every `redact` field replaced by its keyed
    #: digest): what a store or a list shared by many may keep. `args` is what a human sees.
    redacted_args: Mapping[str, Any] | None = None
    #: The tool's JSON Schema of parameters, so an approver editing the arguments can be told at once
    #: what the tool would refuse (the gate validates the edited call again in any case).
    parameters: Mapping[str, Any] = field(default_factory=dict)
    #: Where the program made the call (`CallPosition`: 1-based lines, 0-based columns), when the
    #: interpreter reported it: the inbox marks that place in the program, never every line naming the tool.
    position: CallPosition | None = None
    #: What the call takes from each budget it counts against (``{budget: {"calls": 1, "cost": 10}}``);
    #: `budget` is what each budget has left once it is taken (the call's reservation is already held).
    spend: Mapping[str, Any] = field(default_factory=dict)
    #: Who may answer (every spec must hold; `proctor.policy.approvers`); empty: the policy names nobody.
    approvers: tuple[ApproverRule, ...] = ()
    #: The policy's `approval.os_users`: whom each OS user may answer as, and its groups.
    os_users: Mapping[str, OsUser] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "approvers": [spec.as_dict() for spec in self.approvers],
            "call_id": self.call_id,
            "tool": self.tool,
            "side_effect": self.side_effect,
            "args": dict(self.args),
            "rules": list(self.rules),
            "reason": self.reason,
            "policy_sha256": self.policy_sha256,
            "budget": dict(self.budget),
            "spend": dict(self.spend),
            "position": self.position.as_dict() if self.position is not None else None,
            "expires_at_ns": self.expires_at_ns,
            "binding": self.binding,
            "run": self.run.as_dict(),
        }


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    """An approver's answer.

    - ``approve``: run the call as asked.
    - ``deny``: do not run it; `reason` says why.
    - ``edit``: run it with `args` instead (they go through the policy again).
    - ``grant``: approve, and approve `grant` for the rest of the run.

    `timed_out` marks a deny because nobody answered in time; `approver` says who
    decided (a user name, ``webhook:<url>``, ``callback``, ``timeout``…); `method` how that
    name was proven (`proctor.policy.approvers.METHODS`), `answered_at_ns` when the answer was
    given (not when the gate read it), `address` where from, `os_user` the OS account it came from.
    """

    verdict: Verdict
    binding: str
    approver: str = "unknown"
    reason: str = ""
    args: Mapping[str, Any] | None = None
    grant: Grant | None = None
    timed_out: bool = False
    method: str = ""
    answered_at_ns: int = 0
    address: str = ""
    os_user: str = ""

    @classmethod
    def approve(cls, request: ApprovalRequest, approver: str, reason: str = "", *,
                method: str = "") -> ApprovalDecision:
        return cls("approve", request.binding, approver, reason, method=method, answered_at_ns=time.time_ns())

    @classmethod
    def deny(cls, request: ApprovalRequest, approver: str, reason: str, *, timed_out: bool = False,
             method: str = "") -> ApprovalDecision:
        return cls("deny", request.binding, approver, reason, timed_out=timed_out, method=method,
                   answered_at_ns=time.time_ns())

    def answer_facts(self) -> dict[str, Any]:
        """Who answered, how that was proven, from where and when: for the `approval_resolved` record."""
        return {"method": self.method, "answered_at_ns": self.answered_at_ns or None, "address": self.address,
                "os_user": self.os_user}

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "binding": self.binding,
            "approver": self.approver,
            "reason": self.reason,
            "args": dict(self.args) if self.args is not None else None,
            "grant": self.grant.as_dict() if self.grant else None,
            "timed_out": self.timed_out,
            **self.answer_facts(),
        }


@runtime_checkable
class Approver(Protocol):
    """Asks someone whether a call may run.

    Implementations should answer rather than raise: a channel error is a ``deny``
    whose reason names the error. The gate still treats a raise, or an answer bound
    to another call, as a deny.
    """

    def request(self, request: ApprovalRequest) -> ApprovalDecision: ...


@runtime_checkable
class CheckingApprover(Approver, Protocol):
    """An approver that reads answers from a run store, or hands requests to one that does: the gate asks
    it through `request_checked`, with what proves a stored answer."""

    def request_checked(self, request: ApprovalRequest, answers: AnswerCheck) -> ApprovalDecision:
        """`request`, believing only answers `answers` proves (their seal holds under the run's answer key:
        `proctor.store.answerseal`)."""
        ...


@runtime_checkable
class StoredApprover(CheckingApprover, Protocol):
    """An approver whose requests wait in a run store for an answer (`proctor.InboxApprover`): a run it
    cannot answer at once suspends, and an agent given it keeps its runs durable in that store."""

    @property
    def store(self) -> RunStore: ...
    #: How long a request waits for an answer before the run suspends.
    @property
    def wait_s(self) -> float: ...
