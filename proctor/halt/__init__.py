"""Halts: an operator stops matching calls now, on every gate that shares a backend (`proctor halt`).

A `Halt` names what it stops — every call (``all``), one agent, tool (a name or a glob),
principal or run — with the reason the program sees and who set it. Halts live in a
backend every gate of a fleet can read:

- `MemoryHalts`: one process, no shared backend (`gate_halts`, and `install_signal_halt`
  for a halt sent as a signal);
- `proctor.halt.redis.RedisHalts`: a Redis hash of halts and a version counter;
- `proctor.halt.sql.StoreHalts`: a table of the SQLite or PostgreSQL run store.

A gate asks its `HaltChannel` after admission, for each call: ``check(tool, agent,
principal, run_id)`` returns the first halt matching the call, or None; the gate then
refuses the call with `halt_refusal(tool, halt)`. `check` reads a snapshot held in
memory (no I/O on the call's path) that a background thread refreshes every
`refresh_s` (at most 0.25 s). When the backend cannot be read for longer than
`grace_s` (5 s by default), `check` fails closed: it returns a synthetic halt,
`OUTAGE_ID`, naming the backend and how long it has been unreachable, for every call,
until a refresh succeeds again.

A channel tells whoever `watch`es it when a halt starts or ends (a `HaltEvent`: the halt,
who and why, and how it came — ``api``, ``signal``, or ``channel NAME`` for one another
process set on the shared backend): a gate records each as `halt_set` / `halt_lifted` in
its audit trail, so a halt set in-process (the API, SIGUSR2) is audited like one set by
`proctor halt`, and every gate's trail says when it began and stopped honouring it.
"""

from __future__ import annotations

import fnmatch
import inspect
import os
import re
import signal
import threading
import time
import unicodedata
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, Literal, Protocol, cast, runtime_checkable

from proctor.calls import new_id
from proctor.errors import HaltError, ToolDenied

__all__ = ["DEFAULT_GRACE_S", "DEFAULT_REFRESH_S", "HALT_SIGNAL", "MAX_REFRESH_S", "OUTAGE_ID", "SCOPES", "Halt",
           "HaltBackend", "HaltChannel", "HaltError", "HaltEvent", "HaltListener", "HaltsAt", "JointHalts",
           "MemoryHalts", "PolledHalts", "Scope", "SharesHalts", "gate_halts", "halt_refusal", "install_signal_halt",
           "new_halt", "operator"]

Scope = Literal["all", "agent", "tool", "principal", "run"]
SCOPES: tuple[Scope, ...] = ("all", "agent", "tool", "principal", "run")

#: How often a shared channel re-reads its backend, by default, and at most.
DEFAULT_REFRESH_S = 0.1
MAX_REFRESH_S = 0.25
#: How long a shared channel keeps deciding from its last snapshot when the backend cannot be read;
#: past it, every call is refused (fail closed) until the backend answers again.
DEFAULT_GRACE_S = 5.0
#: The id of the synthetic halt `check` returns while the backend is unreachable past the grace period.
OUTAGE_ID = "halt_channel_unreachable"
#: The signal `install_signal_halt` listens to: SIGUSR2. Not SIGTERM (it must stop the process) nor
#: SIGUSR1 (debuggers, profilers and many servers take it); SIGHUP is the policy reload's.
HALT_SIGNAL = signal.SIGUSR2 if hasattr(signal, "SIGUSR2") else None

_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_MAX_TEXT = 2000


@dataclass(frozen=True, slots=True)
class Halt:
    """One active halt: what it stops (`scope`, `value`), why, who set it and when (ns since the epoch)."""

    id: str
    scope: Scope
    value: str | None
    reason: str
    by: str
    at_ns: int

    def matches(self, tool: str, agent: str | None, principal: str | None, run_id: str) -> bool:
        """Whether the halt stops this call. A tool, agent or principal halt names one, or a glob of them
        (``send_*``). Names are compared as text (NFC: a name typed with a composed accent and one written with
        a combining accent are one name), never folded further: a look-alike of another script is another name,
        as it is to budgets and approvals."""
        scope, value = self.scope, self.value
        if scope == "all":
            return True
        if value is None:
            return False
        if scope == "tool":
            return _named(tool, value)
        if scope == "agent":
            return agent is not None and _named(agent, value)
        if scope == "principal":
            return principal is not None and _named(principal, value)
        return run_id == value

    @property
    def target(self) -> str:
        """What it stops, in words: ``all calls``, ``tool send_email``."""
        return "all calls" if self.scope == "all" else f"{self.scope} {self.value}"

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "scope": self.scope, "value": self.value, "reason": self.reason, "by": self.by,
                "at_ns": self.at_ns}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Halt:
        """A halt read from a backend (not trusted): every field checked; `HaltError` naming the bad one."""
        if not isinstance(data, Mapping):
            raise HaltError("a halt must be an object")
        hid, scope, value = data.get("id"), data.get("scope"), data.get("value")
        reason, by, at_ns = data.get("reason"), data.get("by"), data.get("at_ns")
        if not isinstance(hid, str) or not _ID.fullmatch(hid):
            raise HaltError(f"halt id {hid!r} is not 1-128 letters, digits or _.:-")
        if scope not in SCOPES:
            raise HaltError(f"halt {hid}: scope {scope!r} is not one of {', '.join(SCOPES)}")
        if scope == "all":
            if value is not None:
                raise HaltError(f"halt {hid}: a halt of all calls names no value")
        elif not isinstance(value, str) or not value or len(value) > _MAX_TEXT:
            raise HaltError(f"halt {hid}: a {scope} halt needs the {scope} it stops")
        if not isinstance(reason, str) or not reason.strip() or len(reason) > _MAX_TEXT:
            raise HaltError(f"halt {hid}: the reason must be text of 1-{_MAX_TEXT} characters")
        if not isinstance(by, str) or len(by) > _MAX_TEXT:
            raise HaltError(f"halt {hid}: `by` must be text")
        if not isinstance(at_ns, int) or isinstance(at_ns, bool) or at_ns < 0:
            raise HaltError(f"halt {hid}: at_ns must be a non-negative integer")
        return cls(hid, cast(Scope, scope), value, reason, by, at_ns)


def _nfc(text: str) -> str:
    # ASCII (nearly every name) is its own NFC: no normalisation on the call's path for it.
    return text if text.isascii() else unicodedata.normalize("NFC", text)


def _named(name: str, value: str) -> bool:
    """Whether a halt of `value` (a name, or a glob: ``send_*``) stops `name`."""
    if name == value:
        return True
    name, value = _nfc(name), _nfc(value)
    return name == value or (_is_glob(value) and fnmatch.fnmatchcase(name, value))


def _is_glob(value: str) -> bool:
    return any(c in value for c in "*?[")


def operator() -> str:
    """Who is acting: the OS user running the command (recorded as `by` and in the audit record)."""
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError, OSError):
        return os.environ.get("USER") or os.environ.get("USERNAME") or f"uid {os.getuid()}"


def new_halt(scope: Scope, value: str | None, reason: str, by: str | None = None) -> Halt:
    """A fresh halt (id ``halt_…``), checked as a backend's would be."""
    return Halt.from_dict({"id": new_id("halt_"), "scope": scope, "value": None if scope == "all" else value,
                           "reason": reason, "by": by if by is not None else operator(), "at_ns": time.time_ns()})


def halt_refusal(tool: str, halt: Halt, call_id: str = "") -> ToolDenied:
    """The refusal a gate raises for a call `halt` stops: ``"{tool}: halted by {id}: {reason}"``."""
    return ToolDenied(f"{tool}: halted by {halt.id}: {halt.reason}", tool=tool, call_id=call_id)


@dataclass(frozen=True, slots=True)
class HaltEvent:
    """A halt started (``halt_set``) or ended (``halt_lifted``): who, why, and how (`via`).

    `via`: ``api`` (set or lifted in this process through a channel's or a gate's API),
    ``signal`` (`install_signal_halt`), ``channel NAME`` (seen on a shared backend: set or
    lifted by another process). A lift seen on a shared channel does not say who lifted it nor
    why (`by`, `reason` None): the process that lifted it recorded that (`proctor halt --lift`).
    """

    kind: Literal["halt_set", "halt_lifted"]
    halt: Halt
    by: str | None
    reason: str | None
    via: str

    def audit_fields(self) -> dict[str, Any]:
        """The fields of its audit record (the same as `proctor halt` writes, with `via`)."""
        if self.kind == "halt_set":
            return {**self.halt.as_dict(), "halt_id": self.halt.id, "via": self.via}
        return {"halt_id": self.halt.id, "scope": self.halt.scope, "value": self.halt.value, "reason": self.reason,
                "by": self.by, "halt_reason": self.halt.reason, "via": self.via}


#: What `HaltChannel.watch` calls for each halt started or ended (from the thread that saw it).
HaltListener = Callable[[HaltEvent], None]


class _Listeners:
    """A channel's watchers. A bound method is held weakly: a gate that watches its channel (the
    process-wide `gate_halts` outlives every gate) is not kept alive by it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refs: dict[int, Callable[[], HaltListener | None]] = {}
        self._next = 0

    def add(self, listener: HaltListener) -> Callable[[], None]:
        ref: Callable[[], HaltListener | None]
        with self._lock:
            key = self._next
            self._next += 1
        if inspect.ismethod(listener):
            # Dropped when its object is collected (a process making many gates keeps no dead entries);
            # the callback may run inside this object's lock (a collection there): one atomic pop, no lock.
            ref = weakref.WeakMethod(listener, lambda _: self._refs.pop(key, None))
        else:
            def ref(listener: HaltListener = listener) -> HaltListener:
                return listener
        with self._lock:
            self._refs[key] = ref

        def remove() -> None:
            with self._lock:
                self._refs.pop(key, None)

        return remove

    def __len__(self) -> int:
        return len(self._refs)

    def notify(self, event: HaltEvent) -> None:
        with self._lock:
            refs = list(self._refs.items())
        for key, ref in refs:
            listener = ref()
            if listener is None:
                with self._lock:
                    self._refs.pop(key, None)
                continue
            try:
                listener(event)
            except Exception as exc:  # noqa: BLE001 - one watcher's failure neither stops the halt nor the others
                from proctor.telemetry.logging import get_logger  # here: `proctor halt --help` loads no telemetry

                get_logger("proctor.halt").error("halt_listener_failed", halt_id=event.halt.id, kind=event.kind,
                                                 error=repr(exc))


class HaltChannel(Protocol):
    """What a gate asks for each call after admission: the halt stopping it, or None. Cheap: no I/O."""

    def check(self, tool: str, agent: str | None, principal: str | None, run_id: str) -> Halt | None: ...

    def active(self) -> tuple[Halt, ...]:
        """The active halts the channel knows of now (its snapshot)."""
        ...

    @property
    def backend(self) -> HaltBackend:
        """Where this channel's halts are set and lifted (`Gate.halt` writes there)."""
        ...

    def watch(self, listener: HaltListener) -> Callable[[], None]:
        """Call `listener` for each halt that starts or ends from now on; returns what stops it."""
        ...

    def close(self) -> None: ...


class HaltBackend(Protocol):
    """Where halts are kept: what `proctor halt` writes and lists."""

    @property
    def shown(self) -> str:
        """Where, for messages (a URL with its password masked)."""
        ...

    def set(self, halt: Halt) -> Halt: ...

    def lift(self, halt_id: str, *, reason: str = "", by: str | None = None) -> Halt:
        """End the halt `halt_id` (`reason` and `by`: why and who, kept where the backend keeps history);
        return it. `HaltError` when no such halt is active."""
        ...

    def list_halts(self) -> list[Halt]: ...

    def close(self) -> None: ...


def _first(halts: Sequence[Halt], tool: str, agent: str | None, principal: str | None, run_id: str) -> Halt | None:
    for halt in halts:
        if halt.matches(tool, agent, principal, run_id):
            return halt
    return None


class MemoryHalts:
    """Halts of one process: a `HaltChannel` and a `HaltBackend` at once, nothing shared, never unreachable."""

    shown = "this process"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._halts: tuple[Halt, ...] = ()
        self._listeners = _Listeners()

    @property
    def backend(self) -> MemoryHalts:
        return self

    def watch(self, listener: HaltListener) -> Callable[[], None]:
        return self._listeners.add(listener)

    @property
    def watchers(self) -> int:
        """How many watchers it tells (a gate that was collected is no longer one)."""
        return len(self._listeners)

    def check(self, tool: str, agent: str | None, principal: str | None, run_id: str) -> Halt | None:
        halts = self._halts  # one read of an immutable tuple: no lock on the call's path
        return _first(halts, tool, agent, principal, run_id) if halts else None

    def active(self) -> tuple[Halt, ...]:
        return self._halts

    def set(self, halt: Halt | None = None, *, scope: Scope = "all", value: str | None = None,
            reason: str = "", by: str | None = None, via: str = "api") -> Halt:
        """Add `halt`, or one built from `scope`, `value`, `reason`: ``gate_halts.set(reason="incident 42")``.
        In force on return; then its watchers are told (the gates using it audit it as `halt_set`)."""
        if halt is None:
            halt = new_halt(scope, value, reason, by)
        with self._lock:
            self._halts = (*(h for h in self._halts if h.id != halt.id), halt)
        self._listeners.notify(HaltEvent("halt_set", halt, halt.by, halt.reason, via))
        return halt

    def lift(self, halt_id: str, *, reason: str = "", by: str | None = None, via: str = "api") -> Halt:
        """End halt `halt_id` (`reason`, `by`: why and who, for the watchers' `halt_lifted` records)."""
        with self._lock:
            found = next((h for h in self._halts if h.id == halt_id), None)
            if found is None:
                raise HaltError(f"no active halt {halt_id!r}")
            self._halts = tuple(h for h in self._halts if h.id != halt_id)
        self._listeners.notify(HaltEvent("halt_lifted", found, by if by is not None else operator(), reason, via))
        return found

    def list_halts(self) -> list[Halt]:
        return list(self._halts)

    def close(self) -> None:
        pass


#: This process's own halts: ``proctor.halt.gate_halts.set(reason=…)`` stops every call of the gates
#: that use it (a gate given no shared halt channel), ``gate_halts.lift(id)`` ends it.
gate_halts = MemoryHalts()


def install_signal_halt(halts: MemoryHalts | None = None, signum: int | None = None,
                        reason: str = "halted by signal") -> Callable[[], None]:
    """Halt every call of this process when it receives `signum` (`HALT_SIGNAL`, SIGUSR2, by default):
    ``kill -USR2 PID``. Lifted with the API (``gate_halts.lift(id)``), never by a signal. Must be called
    from the main thread (Python installs handlers only there). Returns a function that uninstalls it."""
    target = gate_halts if halts is None else halts
    sig = HALT_SIGNAL if signum is None else signum
    if sig is None:
        raise HaltError("this platform has no SIGUSR2: pass the signal to use")
    if threading.current_thread() is not threading.main_thread():
        raise HaltError("install_signal_halt must be called from the main thread (Python's signal handlers run there)")

    def on_signal(number: int, frame: FrameType | None) -> None:
        name = signal.Signals(number).name
        # The handler runs in the main thread between two bytecodes, maybe inside `set` holding its lock:
        # the halt is set from a thread of its own, which waits for that lock instead of deadlocking on it.
        threading.Thread(target=target.set, name="proctor-signal-halt", daemon=True,
                         kwargs={"scope": "all", "reason": f"{reason} ({name} to pid {os.getpid()})",
                                 "by": f"signal {name}", "via": "signal"}).start()

    previous = signal.signal(sig, on_signal)

    def uninstall() -> None:
        signal.signal(sig, previous)

    return uninstall


class PolledHalts:
    """A `HaltChannel` over a shared backend: a snapshot refreshed by a background thread every `refresh_s`.

    `read` returns the backend's active halts (raising when it cannot be read). Until the first
    read succeeds, and whenever reads have failed for longer than `grace_s`, `check` returns the
    synthetic halt `OUTAGE_ID` for every call (fail closed). The thread is a daemon; `close` stops it.
    A forked child has no such thread (fork keeps only the calling one): it opens a channel of its own,
    or its copy fails closed once the grace period has passed.
    """

    def __init__(self, read: Callable[[], Sequence[Halt]], name: str, *, refresh_s: float = DEFAULT_REFRESH_S,
                 grace_s: float = DEFAULT_GRACE_S, wait_s: float = 2.0, backend: HaltBackend | None = None) -> None:
        if not 0 < refresh_s <= MAX_REFRESH_S:
            raise HaltError(f"refresh_s must be in (0, {MAX_REFRESH_S}] seconds, not {refresh_s}")
        if not grace_s >= refresh_s:  # (so that NaN, which compares false with everything, is refused too)
            raise HaltError(f"grace_s ({grace_s}) must be at least refresh_s ({refresh_s})")
        self._read = read
        self._backend = backend
        self._listeners = _Listeners()
        self.name = name
        self.refresh_s = refresh_s
        self.grace_s = grace_s
        self._halts: tuple[Halt, ...] = ()
        self._ok_at = 0.0  # monotonic time of the last good read (0: none yet)
        self._error = "not read yet"
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._refresh_lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=f"proctor-halts {name}", daemon=True)
        self._thread.start()
        self._ready.wait(wait_s)  # the first snapshot, when the backend answers promptly

    def _refresh(self, wait_s: float = -1, *, unless_read: bool = False) -> None:
        # The thread, `refresh` and a never-read `check` (which waits at most `wait_s`: a lock a fork copied
        # held is never released, and takes the answer of a read made meanwhile instead of a second one):
        # one read at a time.
        if not self._refresh_lock.acquire(timeout=wait_s):
            return
        try:
            if unless_read and self._ok_at:
                return
            try:
                halts = tuple(self._read())
            except Exception as exc:  # noqa: BLE001 - any failure to read is an outage, counted against the grace
                self._error = str(exc) or type(exc).__name__
                return
            before, known = self._halts, self._ok_at != 0
            self._halts = halts
            self._error = ""
            self._ok_at = time.monotonic()
            if known:  # halts started or ended since the last good read
                self._tell(before, halts)
            elif halts:
                # The first good read: what it finds is in force from here on. A watcher that came before it (a
                # gate made while the backend could not be reached) knew of none of them; one that came after
                # read them from `active` (a gate records each halt it is told of once).
                self._tell((), halts, via=f"in force when channel {self.name} was first read")
        finally:
            self._refresh_lock.release()

    def _tell(self, before: tuple[Halt, ...], after: tuple[Halt, ...], via: str | None = None) -> None:
        old, new = {h.id for h in before}, {h.id for h in after}
        if old == new:
            return
        via = via or f"channel {self.name}"
        for halt in after:
            if halt.id not in old:
                self._listeners.notify(HaltEvent("halt_set", halt, halt.by, halt.reason, via))
        for halt in before:
            if halt.id not in new:
                self._listeners.notify(HaltEvent("halt_lifted", halt, None, None, via))

    @property
    def backend(self) -> HaltBackend:
        if self._backend is None:
            raise HaltError(f"the halt channel {self.name} was given no backend to set halts on")
        return self._backend

    def watch(self, listener: HaltListener) -> Callable[[], None]:
        return self._listeners.add(listener)

    @property
    def watchers(self) -> int:
        """How many watchers it tells (a gate that was collected is no longer one)."""
        return len(self._listeners)

    #: Called by the refreshing thread once nobody watches the channel any more (every gate on it collected);
    #: returns whether the channel is done (then the thread stops). `proctor.halt.shared` sets it.
    on_unwatched: Callable[[PolledHalts], bool] | None = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._refresh()
            self._ready.set()
            if self.on_unwatched is not None and not len(self._listeners) and self.on_unwatched(self):
                self._stop.set()
                return
            self._stop.wait(self.refresh_s)

    def refresh(self) -> None:
        """Read the backend now (the thread does it every `refresh_s`)."""
        self._refresh()

    def _outage(self) -> Halt:
        if self._ok_at:
            seen = f"not read for {time.monotonic() - self._ok_at:.1f}s"
        else:
            seen = "never read"
        return Halt(OUTAGE_ID, "all", None,
                    f"the halt channel {self.name} cannot be read ({seen}: {self._error}); every call is refused "
                    f"past the {self.grace_s:g}s grace period until it answers", "proctor", time.time_ns())

    def check(self, tool: str, agent: str | None, principal: str | None, run_id: str) -> Halt | None:
        # Before the first good read nothing is known: refused (fail closed), after one more try to read, so
        # that a gate made while its backend was down serves calls as soon as the backend is back, not a
        # refresh later; after it, the grace applies and a call never waits for the backend.
        if not self._ok_at:
            self._refresh(wait_s=self.grace_s, unless_read=True)
        if time.monotonic() - self._ok_at > self.grace_s:
            return self._outage()
        halts = self._halts
        return _first(halts, tool, agent, principal, run_id) if halts else None

    def active(self) -> tuple[Halt, ...]:
        return self._halts

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2)


#: Where a shared backend keeps its halts: ``("redis", URL)`` (a Redis ledger's server) or ``("store", URL)``
#: (a SQL run store's ``halts`` table).
HaltsAt = tuple[Literal["redis", "store"], str]


@runtime_checkable
class SharesHalts(Protocol):
    """A backend a fleet shares whose halts every gate sharing it honours: a Redis ledger, a SQL run store
    (what `proctor halt --ledger URL` or `--store URL` writes to). It only says where they are; the gate
    opens the channel (`proctor.halt.shared.default_halts`)."""

    @property
    def halts_at(self) -> HaltsAt: ...


class JointHalts:
    """Several halt channels as one (a `HaltChannel`): a call is stopped by the first halt any of them holds;
    halts are set and lifted on the first, `primary`. What a gate honours by default
    (`proctor.halt.shared.default_halts`)."""

    def __init__(self, primary: HaltChannel, *others: HaltChannel) -> None:
        self.primary = primary
        self.channels: tuple[HaltChannel, ...] = (primary, *others)

    def check(self, tool: str, agent: str | None, principal: str | None, run_id: str) -> Halt | None:
        for channel in self.channels:
            halt = channel.check(tool, agent, principal, run_id)
            if halt is not None:
                return halt
        return None

    def active(self) -> tuple[Halt, ...]:
        return tuple(halt for channel in self.channels for halt in channel.active())

    @property
    def backend(self) -> HaltBackend:
        return self.primary.backend

    def watch(self, listener: HaltListener) -> Callable[[], None]:
        removers = [channel.watch(listener) for channel in self.channels]

        def remove() -> None:
            for stop in removers:
                stop()

        return remove

    def close(self) -> None:
        """Nothing: the channels joined are the process's and its shared backends' (`proctor.halt.shared`),
        which other gates read too."""
