"""The audit interface the gate writes to: a sink that returns results, never raises.

Following the OpenTelemetry exporters' rule, a sink reports failure as a value
(`AuditResult.ok` false with a reason) instead of raising across the boundary; the
gate turns a failed *intent* write into a refused call (`AuditError`).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from proctor.calls import JSONValue
from proctor.redaction import Redacted

__all__ = ["KINDS", "AuditReader", "AuditResult", "AuditSink", "AuditStartReader", "derive_key"]

#: Record kinds, as written in the `kind` field.
KINDS = (
    "run_started",
    "run_finished",
    "step",
    "call_intent",
    "call_outcome",
    "approval_requested",
    "approval_resolved",
    "budget_exhausted",
    "worker_started",
    "protocol_violation",
    "checkpoint",
    "recovery",
    "run_suspended",
    "run_resumed",
    "call_replayed",
    "replay_diverged",
    "resume_refused",
    "shadow_decision",
    "halt_set",
    "halt_lifted",
    "policy_changed",
    "approval_refused",
)


@dataclass(frozen=True, slots=True)
class AuditResult:
    """The result of one append: `ok` with the record's `seq`, or not ok with a reason."""

    ok: bool
    seq: int | None = None
    error: str | None = None


@runtime_checkable
class AuditSink(Protocol):
    """Where the gate records what happens. `AuditLog` and `proctor.testing.InMemoryAudit` are sinks."""

    def append(self, kind: str, fields: Mapping[str, JSONValue], *, durable: bool = True) -> AuditResult:
        """Append one record; when `durable`, return only once it is on stable storage."""
        ...

    def redact(self, args: Mapping[str, JSONValue], fields: Sequence[str]) -> Redacted:
        """Redact `fields` of `args` with this sink's key (see `proctor.redaction`)."""
        ...

    def key_for(self, purpose: str) -> bytes:
        """A secret of this sink's, derived for `purpose`, that never leaves the trail's side (a run store's
        seals use it: `proctor.store.seal`). The same for every process writing this trail."""
        ...

    def close(self) -> None:
        """Seal and release the sink; appending afterwards fails."""
        ...


@runtime_checkable
class AuditReader(Protocol):
    """A sink whose records can be read back by run: a durable run's resume checks its store against them
    (`proctor.store.trail`). `AuditLog`, `PostgresAuditLog` and `InMemoryAudit` are readers."""

    def run_records(self, run_id: str) -> list[dict[str, JSONValue]]:
        """Every record of run `run_id` the trail holds, in order; `AuditError` when it cannot be read."""
        ...


@runtime_checkable
class AuditStartReader(AuditReader, Protocol):
    """A reader that can begin a run's records at the run's start, so that reading them costs what they cost in a
    trail many runs share (`AuditLog`; the PostgreSQL log needs no start: it reads by an index on the run)."""

    def run_records_from(self, run_id: str, start: int) -> list[dict[str, JSONValue]]:
        """`run_records(run_id)`, beginning at record `start`: the seq of the run's `run_started`, as the run's saved
        record says. A hint, not believed: the reader begins there (no record of a run comes before its start)
        only after checking that the record there is that run's `run_started`, and reads as `run_records` does
        when it is not."""
        ...


def derive_key(secret: bytes, purpose: str) -> bytes:
    """`secret` (a sink's redaction key) derived for one `purpose`, so no two uses share a key."""
    return hmac.new(secret, b"proctor key v1\x00" + purpose.encode(), hashlib.sha256).digest()
