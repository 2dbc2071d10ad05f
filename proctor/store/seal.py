"""Seals: what a durable run writes to its store, made checkable by a key the store does not hold.

A run store is not trusted (docs/durable.md, "Who can do what"): whoever can write its
tables could otherwise approve calls (a `grant` added to a journal entry), give budgets
back, or erase the history that rules read. So every journal entry and every saved run
record carries a seal — an HMAC-SHA256 over its canonical JSON and its place (run, step,
position), keyed by a secret of the run's audit sink (`AuditSink.key_for("run-store")`),
which lives with the audit trail and never in the store. The run record saved at each step's
start and at a suspension seals how many entries each step's journal had, so an entry
forged, changed, moved, copied from another run or step, or dropped breaks a seal.
`check_run` is what a resume calls before it runs anything.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import fields
from typing import Any

from proctor.canonical import canonical_bytes, json_shaped
from proctor.errors import StoreForged
from proctor.store.base import JournalEntry, RunRecord

__all__ = ["PURPOSE", "RECORD_UNSEALED", "StoreSeal"]

#: What the audit sink's key is derived for.
PURPOSE = "run-store"

#: Fields of a run record the store itself keeps, outside the seal: the resumer never believes them
#: (the owner is checked by claiming, the version by saving). A status the run did not write (a cancel)
#: breaks the seal, so a cancelled or finished run set back to `suspended` is refused.
RECORD_UNSEALED = frozenset({"owner", "version", "updated_at_ns", "seal"})


#: The fields of a journal entry its seal covers (all but the seal), in declaration order.
_ENTRY_SEALED = tuple(f.name for f in fields(JournalEntry) if f.name != "seal")


class StoreSeal:
    """Seals and checks a run's store entries with one key."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, kind: str, payload: Mapping[str, Any]) -> str:
        body = canonical_bytes({"kind": kind, **payload})
        return hmac.new(self._key, body, hashlib.sha256).hexdigest()

    def _macjson_shaped(self, kind: str, name: str, data: dict[str, Any]) -> str:
        """`_mac(kind, {name: asdictjson_shaped(data)})`, without the copy when `data` is JSON data already (what a
        store reads back): canonical JSON writes mappings and sequences the same way `asdict_plain` makes them."""
        try:
            body = canonical_bytes({"kind": kind, name: data})
        except TypeError:  # a key that is not a string: asdict_plain writes it as one
            return self._mac(kind, {name: asdictjson_shaped(data)})
        return hmac.new(self._key, body, hashlib.sha256).hexdigest()

    # -- journal --------------------------------------------------------------------------------

    def seal_entry(self, entry: JournalEntry) -> str:
        """The seal of `entry` (its run, step and position are in what it covers)."""
        # Field by field, not `dataclasses.asdict` (a deep copy, most of a resume's checking time): the
        # values are JSON data, which `asdict_plain` copies into the same plain form either way.
        return self._macjson_shaped("journal", "entry", {name: getattr(entry, name) for name in _ENTRY_SEALED})

    def check_journal(self, run_id: str, step: int, entries: Sequence[JournalEntry]) -> None:
        """Check a step's entries: each in its place (seq 0, 1, …, of this run and step), each seal holding."""
        for problem in self.journal_problems(run_id, step, entries):
            raise StoreForged(problem)

    def journal_problems(self, run_id: str, step: int, entries: Sequence[JournalEntry]) -> Iterator[str]:
        """What does not hold of a step's entries, one line each naming the run, step and entry."""
        for position, entry in enumerate(entries):
            where = f"run {run_id}, step {step}, journal entry {entry.seq} ({entry.tool})"
            if entry.run_id != run_id or entry.step != step or entry.seq != position:
                yield f"{where}: out of place (a journal entry was dropped, moved or copied)"
            elif not entry.seal or not hmac.compare_digest(entry.seal, self.seal_entry(entry)):
                yield f"{where}: its seal does not hold (written or changed outside the run)"

    # -- run records ----------------------------------------------------------------------------

    def seal_record(self, record: RunRecord) -> str:
        data = {f.name: getattr(record, f.name) for f in fields(record) if f.name not in RECORD_UNSEALED}
        return self._macjson_shaped("run", "record", data)

    def check_record(self, record: RunRecord) -> None:
        problem = self.record_problem(record)
        if problem is not None:
            raise StoreForged(problem)

    def record_problem(self, record: RunRecord) -> str | None:
        """Why the saved run's seal does not hold, or None when it does."""
        if not record.seal or not hmac.compare_digest(record.seal, self.seal_record(record)):
            return (f"run {record.run_id}: the saved run's seal does not hold (its task, history, budgets, grants, "
                    "messages or steps were written or changed outside the run)")
        return None

    def check_run(self, record: RunRecord, journals: Mapping[int, Sequence[JournalEntry]]) -> None:
        """Everything a resume reads of a run: its record, and each step's journal up to the heads it sealed."""
        for problem in self.run_problems(record, journals):
            raise StoreForged(problem)

    def run_problems(self, record: RunRecord, journals: Mapping[int, Sequence[JournalEntry]]) -> Iterator[str]:
        """Every seal of the run that does not hold, and every entry the record sealed that is gone."""
        problem = self.record_problem(record)
        if problem is not None:
            yield problem
            return  # the heads below are the record's: not believed once its seal fails
        counts = dict(record.journal_heads)
        for step, entries in sorted(journals.items()):
            yield from self.journal_problems(record.run_id, step, entries)
            sealed = counts.get(str(step))
            if sealed is not None and int(sealed.get("count", 0)) > len(entries):
                yield (f"run {record.run_id}, step {step}: {int(sealed['count']) - len(entries)} journal "
                       "entries are missing (dropped from the store)")


def asdictjson_shaped(data: Mapping[str, Any]) -> dict[str, Any]:
    """Mappings and sequences as JSON holds them, so a record seals the same before and after a round trip."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        out[key] = json_shaped(value)
    return out


