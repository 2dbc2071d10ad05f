"""Halts shared through a SQLite or PostgreSQL run store (``--store URL``): its ``halts`` table.

A row per halt, kept after it is lifted (``lifted_at_ns`` and who lifted it, why, in its
data), so the table is also the halts' history; the active ones are those not lifted. A
gate's `StoreHalts` channel reads them every `refresh_s` (one indexed read of a small table)
on a store connection of its own, so the gate's own store traffic never waits on it.
"""

from __future__ import annotations

import time
from typing import Any

from proctor.errors import StoreError
from proctor.halt import DEFAULT_GRACE_S, DEFAULT_REFRESH_S, Halt, HaltError, PolledHalts, operator

__all__ = ["StoreHaltBackend", "StoreHalts"]


class StoreHaltBackend:
    """The halts kept in a run store (a `proctor.halt.HaltBackend`): what `proctor halt --store URL` writes."""

    def __init__(self, url: str) -> None:
        from proctor.store import RunStore
        from proctor.store.sql import SQLRunStore

        try:
            store = RunStore.open(url)
        except StoreError as exc:
            raise HaltError(str(exc)) from None
        if not isinstance(store, SQLRunStore):
            store.close()
            raise HaltError(f"{url}: halts need a SQLite or PostgreSQL run store")
        self.store: SQLRunStore = store
        self.shown = store.where

    def set(self, halt: Halt) -> Halt:
        try:
            self.store.set_halt(halt.as_dict())
        except StoreError as exc:
            raise HaltError(f"halts at {self.shown}: cannot set the halt: {exc}") from None
        return halt

    def lift(self, halt_id: str, *, reason: str = "", by: str | None = None) -> Halt:
        lifted: dict[str, Any] = {"by": by if by is not None else operator(), "reason": reason,
                                  "at_ns": time.time_ns()}
        try:
            data = self.store.lift_halt(halt_id, lifted)
        except StoreError as exc:
            raise HaltError(f"halts at {self.shown}: cannot lift the halt: {exc}") from None
        if data is None:
            raise HaltError(f"halts at {self.shown}: no active halt {halt_id!r} (proctor halt --list shows them)")
        return Halt.from_dict(data)

    def list_halts(self) -> list[Halt]:
        try:
            rows = self.store.active_halts()
        except (StoreError, ValueError) as exc:  # (ValueError: a row's data that is not JSON)
            raise HaltError(f"halts at {self.shown}: cannot read the halts: {exc}") from None
        # Rows are not trusted: one that is not a valid halt fails the read (the channel then fails closed).
        out = []
        for row_id, data in rows:
            try:
                halt = Halt.from_dict(data)
            except HaltError as exc:
                raise HaltError(f"halts at {self.shown}: a row is not a halt: {exc}") from None
            if halt.id != row_id:  # a copy of a halt under another row: its lift would leave the copy in force
                raise HaltError(f"halts at {self.shown}: row {row_id!r} holds halt {halt.id!r}")
            out.append(halt)
        return out

    def close(self) -> None:
        self.store.close()


class StoreHalts(PolledHalts):
    """A gate's `HaltChannel` on a run store's ``halts`` table, read every `refresh_s`."""

    def __init__(self, url: str, *, refresh_s: float = DEFAULT_REFRESH_S, grace_s: float = DEFAULT_GRACE_S) -> None:
        self._store = StoreHaltBackend(url)
        super().__init__(self._store.list_halts, self._store.shown, refresh_s=refresh_s, grace_s=grace_s,
                         backend=self._store)

    @property
    def backend(self) -> StoreHaltBackend:
        return self._store

    def close(self) -> None:
        super().close()
        self._store.close()
