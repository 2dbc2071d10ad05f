"""`proctor serve --resume`: the server resumes suspended runs itself once every call they wait for is answered."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from proctor.errors import ProctorError
from proctor.store.base import RunStore
from proctor.telemetry.logging import get_logger

__all__ = ["Resumer", "ready_runs"]

log = get_logger("proctor.serve")


def ready_runs(store: RunStore) -> list[str]:
    """Suspended runs none of whose approvals is still pending: what `resume` can take up now."""
    ready = []
    for record in store.list_runs(status="suspended"):
        waiting = set(record.pending)
        states = {a.id: a.status for a in store.list_approvals(status=None, run_id=record.run_id) if a.id in waiting}
        if waiting and all(states.get(i) not in (None, "pending") for i in waiting):
            ready.append(record.run_id)
    return ready


class Resumer:
    """A thread that looks every `interval_s` for ready runs and resumes each with a fresh agent."""

    def __init__(self, store: RunStore, make_agent: Callable[[], Any], *, interval_s: float = 1.0) -> None:
        self.store, self.make_agent, self.interval_s = store, make_agent, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="proctor-resumer", daemon=True)
        self.resumed: list[tuple[str, str]] = []  # (run_id, status), for the log and tests

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                for run_id in ready_runs(self.store):
                    self.resume(run_id)
            except ProctorError as exc:
                log.error("resume_scan_failed", error=str(exc))

    def resume(self, run_id: str) -> None:
        try:
            with self.make_agent() as agent:
                result = agent.resume(run_id)
        except ProctorError as exc:  # held by another process, cancelled meanwhile: the next scan sees
            log.warning("resume_skipped", run_id=run_id, error=str(exc))
            return
        self.resumed.append((run_id, result.status))
        log.info("run_resumed", run_id=run_id, status=result.status)
