"""Halts in the inbox: the active ones on every page, and "halt this run" for the approvers allowed to.

The inbox reads and writes halts through a `proctor.halt.HaltBackend` — the run store's own
``halts`` table when it is SQLite or PostgreSQL, or the fleet's Redis (``--halts redis://…``)
— the backend the gates' channels read, so a halt set here stops the run's calls on every
gate within their refresh. Who may halt: approvers in one of the groups named with
``--halt-groups`` (the token file's ``groups=``); nobody when none are named. A halt set here
is a halt of one run (``scope: run``), recorded in the audit log (``--audit``) as `halt_set`
with who (the approver), why, from where, and ``via: inbox``; without an audit log the inbox
offers no halting (every halt is audited). Set first, recorded second, as `proctor halt` does:
stopping calls is never the dangerous direction, and a halt the log could not record is said
to be in force. The same approvers may lift a halt of one run (its id typed as confirmation):
recorded first (`halt_lifted`), lifted only once the record is written, and never by the approver who
started the run (four eyes; a run the store does not hold is lifted with `proctor halt`). Wider halts (a tool,
an agent, everything) are lifted with `proctor halt --lift ID`.
"""

from __future__ import annotations

import datetime as dt
import shlex
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from proctor.audit.base import AuditSink
from proctor.errors import HaltRefused
from proctor.halt import Halt, HaltBackend, HaltError, HaltEvent, new_halt

__all__ = ["HaltDesk", "HaltRefused"]


def _shown(halt: Halt) -> dict[str, Any]:
    when = dt.datetime.fromtimestamp(halt.at_ns / 1e9, tz=dt.timezone.utc).isoformat(timespec="seconds")
    return {**halt.as_dict(), "target": halt.target, "at": when}


@dataclass
class HaltDesk:
    """The inbox's view of halts: what is active, what stops a run, and setting a run's halt."""

    backend: HaltBackend | None
    audit: AuditSink | None
    groups: Collection[str] = ()
    #: Who started run `run_id`, from the run store (None: the store holds no such run).
    principal_of: Callable[[str], str | None] = lambda run_id: None

    def active(self) -> tuple[list[dict[str, Any]], str | None]:
        """The active halts, for display, and why they could not be read (None when they could)."""
        if self.backend is None:
            return [], None
        try:
            return [_shown(h) for h in self.backend.list_halts()], None
        except HaltError as exc:
            return [], f"the halts cannot be read: {exc}"

    @staticmethod
    def stopping(halts: Sequence[dict[str, Any]], run_id: str, principal: str | None, agent: str | None,
                 tool: str | None = None) -> list[dict[str, Any]]:
        """Those of `halts` that stop calls of this run (of `tool`, when given; else of any tool)."""
        out = []
        for shown in halts:
            halt = Halt.from_dict({k: shown[k] for k in ("id", "scope", "value", "reason", "by", "at_ns")})
            if halt.scope == "tool" and tool is None:
                continue  # it stops some of the run's calls, not the run: listed in the banner
            if halt.matches(tool or "", agent or None, principal, run_id):
                out.append(shown)
        return out

    def lift_command(self, halt_id: str) -> str:
        """The `proctor halt --lift` an operator runs for what the inbox does not lift: whole, with the backend the
        inbox reads (a Redis ledger's or a run store's), so it lifts the halt it names and not one elsewhere."""
        shown = self.backend.shown if self.backend is not None else "URL"
        flag = "--ledger" if shown.split("://", 1)[0].lower() in ("redis", "rediss", "unix") else "--store"
        return f"proctor halt --lift {halt_id} --reason TEXT {flag} {shlex.quote(shown)} --audit LOG"

    def may_halt(self, approver_groups: Sequence[str] | None) -> bool:
        return bool(self.groups) and bool(set(approver_groups or ()) & set(self.groups))

    def refusal(self, approver_groups: Sequence[str] | None) -> HaltRefused | None:
        """Why this approver cannot halt from the inbox (None: they can): 403 not allowed, 503 not set up."""
        if not self.may_halt(approver_groups):
            if not self.groups:
                return HaltRefused(403, "nobody may halt runs from this inbox (proctor serve --halt-groups GROUP "
                                        "names who may)")
            return HaltRefused(403, f"halting runs needs one of the groups {', '.join(sorted(self.groups))}")
        if self.backend is None:
            return HaltRefused(503, "this inbox has no halt backend (proctor serve --halts URL, or a SQLite/"
                                    "PostgreSQL --store)")
        if self.audit is None:
            return HaltRefused(503, "halting from this inbox needs an audit log (proctor serve --audit LOG): every "
                                    "halt is audited")
        return None

    def halt_run(self, run_id: str, reason: str, confirm: str, *, approver: str, address: str, method: str,
                 approver_groups: Sequence[str] | None) -> Halt:
        """Halt every call of run `run_id`; `confirm` must be the run's id, typed. Raises `HaltRefused`."""
        refusal = self.refusal(approver_groups)
        if refusal is not None:
            raise refusal
        assert self.backend is not None and self.audit is not None
        if not reason.strip():
            raise HaltRefused(422, "a halt needs its reason: the program refused sees it, and the audit log keeps it")
        if confirm.strip() != run_id:
            raise HaltRefused(422, f"halting stops every call of the run: type its id, {run_id}, in the "
                                   "confirmation field to halt it")
        try:
            halt = self.backend.set(new_halt("run", run_id, reason.strip(), approver))
        except HaltError as exc:
            raise HaltRefused(503, f"the run is not halted: {exc}") from None
        fields = {**HaltEvent("halt_set", halt, halt.by, halt.reason, "inbox").audit_fields(),
                  "address": address, "method": method, "backend": self.backend.shown}
        try:
            result = self.audit.append("halt_set", fields, durable=True)
            error = None if result.ok else result.error
        except Exception as exc:  # noqa: BLE001 - a sink that raises is a write that failed
            error = repr(exc)
        if error is not None:
            raise HaltRefused(500, f"halt {halt.id} IS IN FORCE but the audit log could not record it: {error}; "
                                   f"lift it with `{self.lift_command(halt.id)}` once the log is writable, or "
                                   "record it by hand")
        return halt

    def lift(self, halt_id: str, reason: str, confirm: str, *, approver: str, address: str, method: str,
             approver_groups: Sequence[str] | None) -> Halt:
        """Lift the halt of one run `halt_id`; `confirm` must be its id, typed. Raises `HaltRefused`."""
        refusal = self.refusal(approver_groups)
        if refusal is not None:
            raise refusal
        assert self.backend is not None and self.audit is not None
        try:
            found = {h.id: h for h in self.backend.list_halts()}.get(halt_id)
        except HaltError as exc:
            raise HaltRefused(503, f"the halts cannot be read: {exc}") from None
        if found is None:
            raise HaltRefused(404, f"no active halt {halt_id!r}")
        if found.scope != "run":
            raise HaltRefused(403, f"the inbox lifts halts of one run; {halt_id} stops {found.target}: lift it with "
                                   f"`{self.lift_command(halt_id)}`")
        # Four eyes: a halt stops a run whoever started it; the one who started it does not lift it. A run the
        # store does not hold (halted with `proctor halt --run`) has no principal to compare: not lifted here.
        principal = self.principal_of(found.value or "")
        if principal is None:
            raise HaltRefused(403, f"run {found.value} is not in this inbox's store, so who started it is unknown: "
                                   f"lift its halt with `{self.lift_command(halt_id)}`")
        if principal == approver:
            raise HaltRefused(403, f"four eyes: {approver} started run {found.value}; another approver (or "
                                   f"`{self.lift_command(halt_id)}`) lifts its halt")
        if not reason.strip():
            raise HaltRefused(422, "a lift needs its reason: the audit log keeps it")
        if confirm.strip() != halt_id:
            raise HaltRefused(422, f"type the halt's id, {halt_id}, in the confirmation field to lift it")
        fields = {**HaltEvent("halt_lifted", found, approver, reason.strip(), "inbox").audit_fields(),
                  "address": address, "method": method, "backend": self.backend.shown}
        try:
            result = self.audit.append("halt_lifted", fields, durable=True)
            error = None if result.ok else result.error
        except Exception as exc:  # noqa: BLE001 - a sink that raises is a write that failed
            error = repr(exc)
        if error is not None:
            raise HaltRefused(500, f"not lifted: the audit log could not record the lift: {error}")
        try:
            return self.backend.lift(halt_id, reason=reason.strip(), by=approver)
        except HaltError as exc:
            raise HaltRefused(503, f"the lift of {halt_id} is recorded but did not happen: {exc}") from None
