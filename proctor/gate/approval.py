"""The approval step of a call the policy sends to a human: a grant, or an approver's answer judged.

A call that `admit` decided `require_approval` comes here after its budgets are reserved
and before its intent is written. An earlier grant of the run may answer it; otherwise the
approver is asked with the clear arguments (but for fields hidden from approvers too),
within the policy's timeout. The answer is judged — bound to this call, in time, a known
verdict — and an edit is a new call, admitted again through `proctor.policy.admission`.
Every request and answer is recorded by the gate's recorder.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from proctor.approval.base import (
    ApprovalDecision,
    ApprovalRequest,
    Approver,
    CheckingApprover,
    Grant,
    StoredApprover,
    approval_binding,
)
from proctor.approval.tokens import TokenFile
from proctor.audit.base import AuditSink
from proctor.errors import (
    ApprovalDenied,
    ApprovalTimeout,
    BudgetExceeded,
    CallRefused,
    ConfigurationError,
    RunSuspended,
)
from proctor.gate.call import Approval, InFlight
from proctor.gate.recorder import safely
from proctor.policy.admission import admit
from proctor.policy.approvers import Answerer, os_answerer, refusal
from proctor.policy.engine import ToolFacts
from proctor.redaction import secret_values
from proctor.store.answerseal import PURPOSE as ANSWER_PURPOSE
from proctor.store.answerseal import AnswerCheck, AnswerSeal
from proctor.telemetry import semconv as sc
from proctor.telemetry.logging import get_logger
from proctor.tools import run_with_timeout

if TYPE_CHECKING:
    from proctor.gate.gate import Gate, PolicyLike
    from proctor.gate.recorder import Recorder

__all__ = ["APPROVAL_GRACE_S", "ApprovalStep"]

log = get_logger("proctor.gate")

#: How long past an approval's expiry the gate waits for an approver that has not answered.
APPROVAL_GRACE_S = 1.0


def _hidden_fields(facts: ToolFacts) -> tuple[str, ...]:
    """Fields the policy hides from approvers as well (`tools: X: {hide_from_approvers: [...]}`)."""
    return facts.hide_from_approvers


def _restore_hidden(given: dict[str, Any], shown: Mapping[str, Any], clear: Mapping[str, Any],
                    fields: tuple[str, ...]) -> dict[str, Any]:
    """`given` (an approver's edit) with each hidden field that still holds what was shown set back to its value."""
    out = dict(given)
    for name in fields:
        path = name.split(".")
        if _get(out, path) == _get(shown, path) is not _ABSENT and _get(clear, path) is not _ABSENT:
            out = _put(out, path, _get(clear, path))
    return out


_ABSENT: Any = object()


def _get(node: Any, path: list[str]) -> Any:
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _put(node: Mapping[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    out = dict(node)
    out[path[0]] = value if len(path) == 1 else _put(out.get(path[0]) or {}, path[1:], value)
    return out


class _Refusals:
    """Where the gate records an answer it does not believe (``approval_refused``): its own audit trail,
    through its one writer, about the call that asked."""

    def __init__(self, step: ApprovalStep, p: InFlight) -> None:
        self.step, self.p = step, p

    def record(self, fields: Mapping[str, Any]) -> str | None:
        result = self.step.recorder.about(self.p, "approval_refused", fields)
        if result is None:
            return "the gate keeps no audit trail"
        return None if result.ok else str(result.error)


class ApprovalStep:
    """The approval step of one gate's calls (it reads the gate's current policy, approver and recorder)."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self._seal: tuple[AuditSink, AnswerSeal] | None = None

    def answer_seal(self) -> AnswerSeal | None:
        """What proves an answer read from a run store: the gate's audit trail's key for answers
        (`proctor.store.answerseal`); None without a trail (then no stored answer is believed)."""
        audit = self.gate.audit
        if audit is None:
            return None
        if self._seal is None or self._seal[0] is not audit:
            self._seal = (audit, AnswerSeal(audit.key_for(ANSWER_PURPOSE)))
        return self._seal[1]

    @property
    def recorder(self) -> Recorder:
        return self.gate.recorder

    @property
    def policy(self) -> PolicyLike:
        return self.gate.policy

    @property
    def approver(self) -> Approver | None:
        return self.gate.approver

    def run(self, p: InFlight) -> CallRefused | RunSuspended | None:
        """Ask for approval (or find a grant); return the refusal, or None when the call may run.

        A managed agent's call may need several: the run policy's from the gate's approver, and
        each of its own policies' from that agent's approver (proctor.narrowing)."""
        if not p.ctx.layers:
            return self._ask(p, self.approver, None)
        asked: list[tuple[Approver | None, list[Grant] | None]] = []
        for layer, vote in p.layer_votes:  # the run policy's first (layer None), then each agent's own
            if vote.outcome != "require_approval":
                continue
            who = (self.approver, None) if layer is None or layer.approver is None else (layer.approver, layer.grants)
            if all(who[0] is not approver for approver, _ in asked):
                asked.append(who)
        for approver, grants in asked:
            refusal = self._ask(p, approver, grants)
            if refusal is not None:
                return refusal
        return None

    def _ask(self, p: InFlight, approver: Approver | None, grants: list[Grant] | None
             ) -> CallRefused | RunSuspended | None:
        """One approval of the call by `approver`; `grants`: where its grants are kept (None: the run's)."""
        assert p.decision is not None and p.redacted is not None
        name = p.name
        grant = p.ctx.granted(name, p.args, grants, p.policy.approval.approvers_for(p.decision.rules),
                              p.decision.policy_sha256)
        if grant is not None:
            p.approval = Approval("grant", "grant", "approved by an earlier grant for this run", grant=grant)
            p.span.approval("granted", "grant", 0)
            return None
        if approver is None:
            return ApprovalDenied(f"{name}: needs approval ({p.decision.reason}) but no approver is configured",
                                  tool=name, call_id=p.call_id, rules=p.decision.rules)
        timeout_s = p.policy.approval.timeout_s
        if p.ctx.layers or p.ctx.deadline is not None:  # a managed agent: the shortest wait, within its time
            timeout_s = min([timeout_s, *(layer.policy.approval.timeout_s for layer in p.ctx.layers)])
            if p.ctx.deadline is not None:
                timeout_s = max(0.0, min(timeout_s, p.ctx.deadline - time.monotonic()))
        # A human sees the clear arguments (nobody can approve a wire without seeing where it
        # goes) except fields the policy hides from approvers too. The binding is computed over
        # the redacted arguments: it is written to the log and sent to webhooks, and a hash of
        # a clear card number could be reversed by brute force.
        request = ApprovalRequest(
            call_id=p.call_id, tool=name, side_effect=p.side_effect, args=self.approver_view(p, p.args),
            rules=p.decision.rules, reason=p.decision.reason, policy_sha256=p.decision.policy_sha256,
            budget=p.ctx.ledger.remaining(),
            spend=p.ctx.ledger.spend(p.reservation) if p.reservation is not None else {},
            expires_at_ns=time.time_ns() + int(timeout_s * 1e9), position=p.position,
            binding=approval_binding(name, p.redacted.args, p.call_id, p.decision.policy_sha256), run=p.ctx.info,
            redacted_args=p.redacted.args,
            parameters=p.tool.parameters,
            approvers=p.policy.approval.approvers_for(p.decision.rules),
            os_users=dict(p.policy.approval.os_users),
        )
        self.recorder.about(p, "approval_requested", {"run_id": p.ctx.info.id, "call_id": p.call_id, "tool": name,
                                                      "args": p.redacted.args, "rules": list(p.decision.rules),
                                                      "reason": p.decision.reason,
                                                      "expires_at_ns": request.expires_at_ns,
                                                      "binding": request.binding,
                                                      "approvers": [a.as_dict() for a in request.approvers],
                                                      "spend": dict(request.spend),
                                                      "position": p.position.as_dict() if p.position else None})
        safely(p.span.event, sc.APPROVAL_REQUESTED_EVENT, {"proctor.approval.expires_at_ns": request.expires_at_ns})
        asked = time.perf_counter_ns()
        # The policy's approval timeout holds even for an approver that never answers (a
        # callback stuck on a socket): past expiry and a short grace, the call is refused.
        wait_s = max(0.0, (request.expires_at_ns - time.time_ns()) / 1e9) + APPROVAL_GRACE_S
        ask: Callable[[], ApprovalDecision]
        if isinstance(approver, CheckingApprover):  # answers read from a store: believed only when sealed
            ask = partial(approver.request_checked, request, AnswerCheck(self.answer_seal(), _Refusals(self, p)))
        else:
            ask = partial(approver.request, request)
        try:
            answer = run_with_timeout(ask, wait_s)
        except RunSuspended as suspended:  # an inbox with no answer yet: the run stops here and resumes later
            suspended.tool, suspended.call_id = name, p.call_id
            wait_ns = time.perf_counter_ns() - asked
            if p.ctx.parent_call_id is not None:  # a managed agent cannot stop its parent's run to wait
                refused = self._cannot_suspend(p, approver, suspended)
                p.span.approval("timeout", type(approver).__name__, wait_ns)
                self.recorder.about(p, "approval_resolved", {"run_id": p.ctx.info.id, "call_id": p.call_id,
                                                             "tool": name, "verdict": "timeout",
                                                             "approver": type(approver).__name__,
                                                             "reason": str(suspended), "wait_ns": wait_ns,
                                                             "grant": None, "refused": str(refused)})
                return refused
            p.span.approval("suspended", type(approver).__name__, wait_ns)
            self.recorder.about(p, "approval_resolved", {"run_id": p.ctx.info.id, "call_id": p.call_id, "tool": name,
                                                         "verdict": "suspended", "approver": type(approver).__name__,
                                                         "reason": str(suspended), "approval_id": suspended.approval_id,
                                                         "wait_ns": wait_ns, "grant": None, "refused": None})
            return suspended
        except TimeoutError:
            answer = ApprovalDecision.deny(request, "timeout", f"no answer from {type(approver).__name__} "
                                           f"within the approval timeout ({timeout_s:g}s)", timed_out=True)
        except Exception as exc:  # noqa: BLE001 - an approver that raises is a channel error: deny
            answer = ApprovalDecision.deny(request, type(approver).__name__, f"approval channel failed: {exc!r}")
        wait_ns = time.perf_counter_ns() - asked
        p.state = "authorized"  # answered (the answer may still refuse the call)
        refusal = self._judge_answer(p, request, answer, grants)
        verdict = "denied" if refusal is not None else answer.verdict
        p.approval = p.approval or Approval(verdict, answer.approver, answer.reason)
        if isinstance(answer, ApprovalDecision):
            p.approval.address = answer.address
        p.approval.wait_ns = wait_ns
        p.span.approval(verdict if refusal is None else ("timeout" if answer.timed_out else "denied"),
                        answer.approver, wait_ns)
        given = answer if isinstance(answer, ApprovalDecision) else None
        self.recorder.about(p, "approval_resolved", {"run_id": p.ctx.info.id, "call_id": p.call_id, "tool": name,
                                                     **p.approval.as_dict(),
                                                     **(given.answer_facts() if given is not None else {}),
                                                     # the answerer's own name and words, kept when refused
                                                     "answered_by": given.approver if given is not None else None,
                                                     "answer_reason": given.reason if given is not None else "",
                                                     "edited": dict(p.approval.args) if p.approval.args else None,
                                                     "refused": str(refusal) if refusal is not None else None})
        return refusal

    def _cannot_suspend(self, p: InFlight, approver: Approver, suspended: RunSuspended) -> CallRefused:
        """An inbox had no answer for a managed agent's call within its wait: refused (the run goes on)."""
        inbox = approver if isinstance(approver, StoredApprover) else None  # an inbox raises RunSuspended
        if suspended.approval_id and inbox is not None:
            try:  # nobody should answer an approval whose call is gone
                inbox.store.void_approval(suspended.approval_id)
            except Exception as exc:  # noqa: BLE001 - the refusal stands; the approval stays listed
                log.error("approval_void_failed", approval_id=suspended.approval_id, error=repr(exc))
        wait = inbox.wait_s if inbox is not None else None
        waited = f" within its wait ({wait:g}s)" if isinstance(wait, (int, float)) else ""
        return ApprovalTimeout(f"{p.name}: no answer from the inbox{waited}, and managed agent "
                               f"{p.ctx.info.agent!r} cannot suspend its parent's run: refused "
                               "(give InboxApprover a longer wait= for calls made by managed agents)",
                               tool=p.name, call_id=p.call_id, rules=p.decision.rules if p.decision else ())

    def _judge_answer(self, p: InFlight, request: ApprovalRequest, answer: object,
                      grants: list[Grant] | None = None) -> CallRefused | None:
        assert p.decision is not None
        name, rules = p.name, p.decision.rules
        if not isinstance(answer, ApprovalDecision):
            return ApprovalDenied(f"{name}: the approver gave no decision ({type(answer).__name__})",
                                  tool=name, call_id=p.call_id, rules=rules)
        if answer.binding != request.binding:
            return ApprovalDenied(f"{name}: approval rejected: the answer is bound to another call",
                                  tool=name, call_id=p.call_id, rules=rules)
        if answer.timed_out or time.time_ns() > request.expires_at_ns:
            return ApprovalTimeout(f"{name}: approval timed out: {answer.reason or 'no answer before expiry'}",
                                   tool=name, call_id=p.call_id, rules=rules)
        who = self._answerer_refusal(p, answer)
        if who is not None:
            log.warning("approval_answer_refused", call_id=p.call_id, approver=answer.approver, reason=who)
            return ApprovalDenied(f"{name}: approval rejected: {who}", tool=name, call_id=p.call_id, rules=rules)
        if answer.verdict == "deny":
            return ApprovalDenied(f"{name}: approval denied by {answer.approver}: {answer.reason or 'no reason'}",
                                  tool=name, call_id=p.call_id, rules=rules)
        if answer.verdict == "grant":
            # The approvers it was given under are the gate's to say (an answer's word is not taken for them).
            grant = replace(answer.grant or Grant(name), approvers=p.policy.approval.approvers_for(rules),
                            policy_sha256=p.decision.policy_sha256)
            if grant.tool != name:
                return ApprovalDenied(f"{name}: approval rejected: a grant for {grant.tool!r} answers no call to it",
                                      tool=name, call_id=p.call_id, rules=rules)
            p.ctx.add_grant(grant, grants)
            p.approval = Approval("grant", answer.approver, answer.reason, grant=grant)
        elif answer.verdict == "edit":
            return self._apply_edit(p, answer)
        elif answer.verdict != "approve":
            return ApprovalDenied(f"{name}: approval rejected: unknown verdict {answer.verdict!r}",
                                  tool=name, call_id=p.call_id, rules=rules)
        return None

    def _apply_edit(self, p: InFlight, answer: ApprovalDecision) -> CallRefused | None:
        """Edited arguments are a new call: admitted again (the one decision), never trusted blindly."""
        name = p.name
        hidden = _hidden_fields(p.facts)
        given = dict(answer.args or {})
        if hidden:  # a hidden field left as the approver was shown it keeps its real value
            given = _restore_hidden(given, self.approver_view(p, p.args), p.args, hidden)
        if p.facts.redact:
            p.ctx.secrets.update(secret_values(given, p.facts.redact))
        if p.reservation is not None:
            # Decided as any call is, before its budgets are reserved: the original call's hold goes back
            # first, so `usage` does not count the call being decided (the edited call reserves anew below).
            p.ctx.ledger.release(p.reservation)
            p.reservation = None
        adm = admit(p.policy, name, given, tools={name: p.tool}, run=p.ctx, layers=p.ctx.layers)
        decision = adm.decision
        if adm.stage == "args":
            return self.recorder.clean(p, ApprovalDenied(f"{name}: edited arguments rejected: {adm.refusal}", tool=name,
                                                         call_id=p.call_id))
        if adm.stage == "policy" and decision is not None:
            return ApprovalDenied(f"{name}: edited arguments denied by the policy: {decision.reason}",
                                  tool=name, call_id=p.call_id, rules=decision.rules)
        if adm.stage != "decided" or decision is None:  # its class or its cost could not be computed
            return self.recorder.clean(p, ApprovalDenied(f"{name}: edited arguments refused: {adm.refusal}", tool=name,
                                                         call_id=p.call_id, rules=decision.rules if decision else ()))
        if decision.outcome == "require_approval":
            # The edited call needs an approval of its own: the editor's answer is it only where the edited
            # call's `approvers:` admit the editor too (else an edit reaches what another approver guards).
            who = self._answerer_refusal(p, answer, decision.rules)
            if who is not None:
                return ApprovalDenied(f"{name}: edited arguments refused: the edited call needs an approval "
                                      f"of its own, and {who}",
                                      tool=name, call_id=p.call_id, rules=decision.rules)
        # Budgets match on the class and count the cost: the edited call is reserved anew, at its own.
        try:
            p.side_effect, p.cost = adm.side_effect, adm.cost
            p.reservation = p.ctx.ledger.reserve(name, adm.side_effect, adm.cost)
        except BudgetExceeded as exc:
            return ApprovalDenied(f"{name}: edited arguments refused: {exc}", tool=name, call_id=p.call_id,
                                  rules=decision.rules)
        original = p.redacted
        p.args, p.decision = cast(dict[str, Any], adm.args), decision
        p.layer_votes = list(adm.votes)
        p.redacted = self.recorder.redact(p.args, p.facts.redact)
        p.span.arguments(p.redacted.args)
        # Original and edited arguments side by side, both redacted as the intent record is.
        p.approval = Approval("edit", answer.approver, answer.reason,
                               args={"original_args": original.args if original else None,
                                     "original_digest": original.digest if original else None,
                                     "args": p.redacted.args, "digest": p.redacted.digest})
        p.span.decision(decision, p.side_effect)
        return None

    def _answerer_refusal(self, p: InFlight, answer: ApprovalDecision,
                          rules: Sequence[str] | None = None) -> str | None:
        """Why the policy's `approvers:` refuse whoever gave `answer` for a call decided by `rules` (None: they
        may answer; `rules` defaults to the call's own decision's, an edit's are its edited call's).

        Checked here again whatever the approver checked: a store row can be forged to name anyone. The
        answerer's groups are the gate's to learn, never the answer's to claim: from the token file the
        policy names (`approval.tokens`) for a token or session answer, from `approval.os_users` for one
        given from an OS account (the store CLI, the console)."""
        assert p.decision is not None
        specs = p.policy.approval.approvers_for(p.decision.rules if rules is None else rules)
        if not specs or answer.timed_out:
            return None
        who = self._answerer(p, answer)
        return who if isinstance(who, str) else refusal(who, specs, p.ctx.info.principal)

    def _answerer(self, p: InFlight, answer: ApprovalDecision) -> Answerer | str:
        settings = p.policy.approval
        if answer.method in ("token", "session", "proxy"):
            if settings.tokens is None:
                return Answerer(answer.approver, answer.method, None)
            try:
                groups = TokenFile.load(settings.tokens).groups.get(answer.approver)
            except ConfigurationError as exc:
                return f"cannot read the token file to check {answer.approver}'s groups: {exc}"
            if groups is None:
                return f"{answer.approver} has no token in {settings.tokens}"
            return Answerer(answer.approver, answer.method, groups)
        if answer.method in ("os-user", "console"):
            account = answer.os_user or answer.approver
            acting = None if answer.approver in (account, f"console:{account}") else answer.approver
            found = os_answerer(account, acting, settings.os_users)
            return found if isinstance(found, str) else Answerer(found.name, answer.method, found.groups,
                                                                  found.os_user)
        if answer.method == "mcp-elicitation":  # the MCP client's user: the session's principal, proving no groups
            return Answerer(answer.approver.removeprefix("mcp-elicitation:"), answer.method, None)
        return Answerer(answer.approver, answer.method or "unknown", None)

    def approver_view(self, p: InFlight, args: Mapping[str, Any]) -> dict[str, Any]:
        """The arguments as an approver sees them: clear, but for fields hidden from approvers too."""
        hidden = _hidden_fields(p.facts)
        return self.recorder.redact(args, hidden).args if hidden else dict(args)
