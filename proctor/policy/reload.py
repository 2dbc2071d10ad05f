"""A policy file that reloads itself when it changes: the gate's policy, without a restart.

`PolicySource(path)` holds the current `Policy` loaded from `path`. Asking it for the policy
(`current()`, or `for_run(run_id)`) stats the file at most every `check_every_ms`
milliseconds (a monotonic-clock compare otherwise: nothing on a call's path touches the
disk between checks); SIGHUP (`install_sighup()`, from the main thread) makes the next ask
check at once. When the file changed, the new text is loaded and validated first:

- a bad policy is refused — its located error (``policy.yaml:12:5: …``) is logged and given
  to `on_refused` — and the old policy keeps deciding; the same bad file is not reported
  again until it changes;
- a good one replaces the old in one assignment, so each ask gets one whole policy: a caller
  that asks once per call decides every call by exactly one policy (the gate asks at a call's
  start and uses that object for the whole call); `on_change` is told the old and new
  fingerprints (the gate writes them as `policy_changed`). A file rewritten to the same
  meaning (same fingerprint) changes nothing.

Runs in flight take the new policy at their next call, unless the new policy says
``reload: new_runs``: `for_run(run_id)` then answers each run that started before it with the
policy in force at the run's first ask, and runs that start later with the new one. The source
remembers each run's first policy until `end_run(run_id)` (the gate calls it when a run finishes).

Wiring in a gate (``Gate(policy=PolicySource(path, on_change=…))``):

    policy = source.for_run(ctx.info.id)     # once, at the call's start
    adm = admit(policy, ...)                 # and the same object for the call's records
    ...                                      # (policy_sha256 = policy.sha256)
    source.end_run(ctx.info.id)              # in finish_run
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from proctor.errors import PolicyError
from proctor.policy.engine import Policy
from proctor.telemetry.logging import get_logger

__all__ = ["DEFAULT_CHECK_EVERY_MS", "PolicyChange", "PolicyRefused", "PolicySource"]

log = get_logger("proctor.policy.reload")

#: How often, at most, the file is stat'ed by default.
DEFAULT_CHECK_EVERY_MS = 500


@dataclass(frozen=True, slots=True)
class PolicyChange:
    """The policy in force changed: from `old` to `new` (`old_sha256`/`new_sha256` their fingerprints)."""

    path: str
    old: Policy
    new: Policy

    @property
    def old_sha256(self) -> str:
        return self.old.sha256

    @property
    def new_sha256(self) -> str:
        return self.new.sha256


@dataclass(frozen=True, slots=True)
class PolicyRefused:
    """A changed file was not a valid policy: the old one (`kept_sha256`) keeps deciding."""

    path: str
    error: PolicyError
    kept_sha256: str

    @property
    def message(self) -> str:
        return str(self.error)


def _stamp(path: str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _tell(callback: Callable[[Any], None], what: PolicyChange | PolicyRefused) -> None:
    """Call a listener: what it raises is logged, and neither undoes the change nor fails the ask that saw it."""
    try:
        callback(what)
    except Exception as exc:  # noqa: BLE001 - a notifier's failure is not the policy's
        log.error("policy_reload_listener_failed", path=what.path, error=repr(exc))


class PolicySource:
    """The current policy of a file, reloaded on change (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], *, check_every_ms: int = DEFAULT_CHECK_EVERY_MS,
                 on_change: Callable[[PolicyChange], None] | None = None,
                 on_refused: Callable[[PolicyRefused], None] | None = None) -> None:
        """Load `path` now (a bad file raises `PolicyError`: a gate does not start on one)."""
        if check_every_ms < 0:
            raise ValueError(f"check_every_ms must be >= 0, not {check_every_ms}")
        self.path = os.fspath(path)
        self.check_every_ns = check_every_ms * 1_000_000
        self.on_change = on_change
        self.on_refused = on_refused
        stamp = _stamp(self.path)
        self._policy = Policy.from_yaml(self.path, regular_only=True)
        self._stamp = stamp
        self._refused_stamp: tuple[int, int, int, int] | None = None
        self._next_ns = time.monotonic_ns() + self.check_every_ns
        self._force = False
        self._loading = threading.Lock()
        self._pins_lock = threading.Lock()
        self._pins: dict[str, Policy] = {}
        self.reloads = 0

    # -- asking -----------------------------------------------------------------------------------

    def current(self) -> Policy:
        """The policy in force now (checking the file first when a check is due)."""
        if self._force or time.monotonic_ns() >= self._next_ns:
            self._check()
        return self._policy

    def for_run(self, run_id: str) -> Policy:
        """The policy deciding run `run_id`'s next call: the current one, unless the current one says
        ``reload: new_runs`` — then the policy in force at the run's first ask (the one it started with)."""
        policy = self.current()
        started = self._pins.get(run_id)
        if started is None:
            with self._pins_lock:
                started = self._pins.setdefault(run_id, policy)
        return started if policy.model.reload == "new_runs" else policy

    def end_run(self, run_id: str) -> None:
        """The run ended: forget its pinned policy (if any)."""
        with self._pins_lock:
            self._pins.pop(run_id, None)

    @property
    def pinned_runs(self) -> int:
        return len(self._pins)

    # -- checking ---------------------------------------------------------------------------------

    def reload(self) -> bool:
        """Check the file now; True when a new policy took effect."""
        self._force = True
        return self._check(wait=True)

    def _check(self, *, wait: bool = False) -> bool:
        # One thread loads; the others go on with the policy in force (they never wait on a parse).
        if not self._loading.acquire(blocking=wait):
            return False
        try:
            forced, self._force = self._force, False
            self._next_ns = time.monotonic_ns() + self.check_every_ns
            stamp = _stamp(self.path)
            if not forced and (stamp == self._stamp or stamp == self._refused_stamp):
                return False
            try:
                new = Policy.from_yaml(self.path, regular_only=True)
            except PolicyError as exc:
                if stamp != self._refused_stamp or forced:
                    self._refused_stamp = stamp
                    refused = PolicyRefused(self.path, exc, self._policy.sha256)
                    log.error("policy_reload_refused", path=self.path, error=str(exc), kept=self._policy.sha256)
                    if self.on_refused is not None:
                        _tell(self.on_refused, refused)
                return False
            self._stamp = stamp
            self._refused_stamp = None
            old = self._policy
            if new.sha256 == old.sha256:
                return False
            self._policy = new  # one assignment: every ask after it gets the whole new policy
            self.reloads += 1
            log.info("policy_changed", path=self.path, old=old.sha256, new=new.sha256)
            if self.on_change is not None:
                _tell(self.on_change, PolicyChange(self.path, old, new))
            return True
        finally:
            self._loading.release()

    # -- SIGHUP -----------------------------------------------------------------------------------

    def install_sighup(self) -> Callable[[], None]:
        """Check the file at the next ask when the process receives SIGHUP (``kill -HUP PID``).

        Only the main thread can install a handler (Python's rule); returns a function restoring the
        previous handler. The handler only sets a flag: loading happens at the next ask, outside it.
        """
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("install_sighup must be called from the main thread (Python's signal handlers "
                               "run there); without it the file is still checked every "
                               f"{self.check_every_ns // 1_000_000} ms")

        previous: Callable[[int, FrameType | None], object] | int | None = None

        def on_hup(number: int, frame: FrameType | None) -> None:
            self._force = True
            # Another source of this process (a second gate's file) installed before this one is told too:
            # one process's SIGHUP checks every policy file it reloads. (Never the default action: it ends it.)
            if callable(previous):
                previous(number, frame)

        previous = signal.signal(signal.SIGHUP, on_hup)

        def uninstall() -> None:
            signal.signal(signal.SIGHUP, previous)

        return uninstall
