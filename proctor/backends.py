"""One resolver from a URL to a backend, for each kind proctor stores something in.

| kind     | URL                                              | backend                                      |
|----------|--------------------------------------------------|----------------------------------------------|
| `ledger` | ``redis://…``, ``rediss://…``, ``unix://…``       | `proctor.ledger.redis.RedisLedger` [redis]   |
| `store`  | a path, ``sqlite:///PATH``                       | `proctor.store.sqlite.SQLiteRunStore`        |
| `store`  | ``postgresql://…``, ``postgres://…``              | `proctor.store.postgres.PostgresRunStore` [postgres] |
| `audit`  | a path                                           | `proctor.audit.log.AuditLog`                 |
| `audit`  | ``postgresql://…?log=NAME``, ``postgres://…``     | `proctor.audit.postgres.PostgresAuditLog` [postgres] |

A backend's module is imported when a URL names it, so an optional extra is needed only by those who
use it; without it, the error names the extra to install. An unknown scheme is refused with the schemes
that kind takes. (`local`/`memory` for a ledger is the process's own ledger, not a URL:
`proctor.ledger.open_ledger` handles it before asking here.)
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, cast, overload

from proctor.errors import ConfigurationError, ProctorError, StoreError
from proctor.urls import shown_url, sqlite_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from proctor.audit.base import AuditSink
    from proctor.audit.keys import KeySource
    from proctor.ledger.base import SharedLedger
    from proctor.store.base import RunStore

__all__ = [
    "AUDIT_KEY_ENV", "KINDS", "AuditFactory", "Backend", "Kind", "default_audit_path", "load_audit", "open_audit",
    "open_store", "register", "resolve", "scheme_of", "store_not_yet_made", "unregister",
]

#: The signing key of audit logs opened from a path or URL, when none is given (`proctor run` reads it too).
AUDIT_KEY_ENV = "PROCTOR_AUDIT_KEY"


def default_audit_path() -> str:
    """The runs' audit trail when none is named: ``$PROCTOR_AUDIT``, else ``$XDG_STATE_HOME/proctor/audit.jsonl``
    (``~/.local/state/proctor/audit.jsonl``). Where `proctor run` writes, and where the commands that check
    or answer those runs (`audit show`, `approvals`, `runs resume`, `serve`, `mcp serve`) look: never
    silently nowhere."""
    explicit = os.environ.get("PROCTOR_AUDIT")
    if explicit:
        return explicit
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "proctor", "audit.jsonl")

Kind = Literal["ledger", "store", "audit"]
KINDS: tuple[Kind, ...] = ("ledger", "store", "audit")


class AuditFactory(Protocol):
    def __call__(self, target: str, *, signing_key: KeySource | None = None) -> AuditSink: ...


@dataclass(frozen=True, slots=True)
class Backend:
    """Where the factory for a scheme lives (``module:attribute``), and the extra that brings its dependencies."""

    target: str
    extra: str | None = None


#: The name of each kind in messages, and the URLs to suggest for it.
_LABELS: dict[Kind, tuple[str, str]] = {
    "ledger": ("ledger", "local or redis://host:6379/0"),
    "store": ("run store", "sqlite:///PATH (or a path) or postgresql://…"),
    "audit": ("audit log", "a file path or postgresql://…?log=NAME"),
}
#: The scheme a URL without one (a plain path) stands for, by kind.
_PATH_SCHEME: dict[Kind, str | None] = {"ledger": None, "store": "sqlite", "audit": "file"}

_REDIS = Backend("proctor.ledger.redis:RedisLedger", "redis")
_PG_STORE = Backend("proctor.store.postgres:PostgresRunStore", "postgres")
_PG_AUDIT = Backend("proctor.audit.postgres:PostgresAuditLog", "postgres")
_BACKENDS: dict[Kind, dict[str, Backend | Callable[[str], object]]] = {
    "ledger": {"redis": _REDIS, "rediss": _REDIS, "unix": _REDIS},
    "store": {"sqlite": Backend("proctor.store.sqlite:SQLiteRunStore"), "postgresql": _PG_STORE, "postgres": _PG_STORE},
    "audit": {"file": Backend("proctor.audit.log:AuditLog"), "postgresql": _PG_AUDIT, "postgres": _PG_AUDIT},
}
_BUILTIN: dict[Kind, frozenset[str]] = {kind: frozenset(schemes) for kind, schemes in _BACKENDS.items()}


def scheme_of(kind: Kind, url: str | os.PathLike[str]) -> str:
    """The scheme of `url` (lower case); a path's is the kind's path scheme (``sqlite`` for a store)."""
    text = os.fspath(url)
    if "://" in text:
        return text.split("://", 1)[0].lower()
    return _PATH_SCHEME[kind] or ""


def register(kind: Literal["ledger", "store"], scheme: str, factory: Callable[[str], object]) -> None:
    """Make URLs of `scheme` open with `factory(url)` for `kind` (a third-party run store, say).

    An audit sink is not registered by scheme: pass the sink itself (`Gate(audit=…)`, `CodeAgent(audit=…)`)."""
    _BACKENDS[kind][scheme.lower()] = factory


def unregister(kind: Literal["ledger", "store"], scheme: str) -> None:
    """Forget a scheme `register` added (the built-in ones stay)."""
    if scheme.lower() in _BUILTIN[kind]:
        raise ConfigurationError(f"{scheme!r} is a built-in {_LABELS[kind][0]} scheme: it cannot be unregistered")
    _BACKENDS[kind].pop(scheme.lower(), None)


def _error(kind: Kind, message: str) -> ProctorError:
    return StoreError(message) if kind == "store" else ConfigurationError(message)


@overload
def resolve(kind: Literal["ledger"], url: str) -> Callable[[str], SharedLedger]: ...
@overload
def resolve(kind: Literal["store"], url: str) -> Callable[[str], RunStore]: ...
@overload
def resolve(kind: Literal["audit"], url: str) -> AuditFactory: ...
def resolve(kind: Kind, url: str) -> object:
    """The factory that opens `url` as a backend of `kind`.

    Raises ConfigurationError (StoreError for a run store) naming the schemes `kind` takes when the scheme
    is unknown, or the extra to install when the backend's dependencies are missing."""
    label, examples = _LABELS[kind]
    shown = shown_url(url, query=False)
    scheme = scheme_of(kind, url)
    backend = _BACKENDS[kind].get(scheme)
    if backend is None and not scheme:
        raise _error(kind, f"unknown {label} {shown!r}: use {examples}")
    if backend is None:
        schemes = ", ".join(sorted(s + "://" for s in _BACKENDS[kind] if s != "file"))
        raise _error(kind, f"unknown {label} URL scheme {scheme!r} in {shown!r}: use {examples} "
                           f"(schemes: {schemes})")
    if not isinstance(backend, Backend):
        return backend
    module, _, attribute = backend.target.partition(":")
    try:
        loaded = importlib.import_module(module)
    except ImportError as exc:  # the extra is missing: say how to get it, never fall back to another backend
        if backend.extra is None:
            raise
        raise _error(kind, f"the {label} {shown} needs {exc.name or backend.extra}: "
                           f"pip install 'proctor[{backend.extra}]'") from None
    return cast(object, getattr(loaded, attribute))


def open_store(url: str | os.PathLike[str], *, create: bool = True) -> RunStore:
    """The run store `url` names (`RunStore.open`); with `create` False, a SQLite file that does not exist is a
    `StoreError` rather than a new, empty store (a command that reads runs, given a mistyped path)."""
    text = os.fspath(url)
    if not text:
        raise StoreError("no run store given: pass --store URL or set PROCTOR_STORE (e.g. sqlite:///runs.db)")
    factory = resolve("store", text)
    missing = None if create else store_not_yet_made(text)
    if missing is not None:
        raise StoreError(f"no run store at {missing}: an agent run with --store creates it; check the path (the "
                         "agents' --store, or PROCTOR_STORE)")
    return factory(text)


def store_not_yet_made(url: str | os.PathLike[str]) -> str | None:
    """The path of the SQLite run store `url` names when no file is there yet (opening it creates one), else None
    (a file there, or a store of another scheme)."""
    text = os.fspath(url)
    if scheme_of("store", text) != "sqlite":
        return None
    path = sqlite_path(text)
    return None if os.path.exists(path) else path


def open_audit(target: str | os.PathLike[str], *, signing_key: KeySource | None = None) -> AuditSink:
    """The audit sink `target` names: a file path (`AuditLog`) or a ``postgresql://`` URL (`PostgresAuditLog`)."""
    text = os.fspath(target)
    if not text:
        raise ConfigurationError("no audit log given: pass a file path or postgresql://…?log=NAME")
    return resolve("audit", text)(text, signing_key=signing_key)


def load_audit(audit: AuditSink | str | os.PathLike[str] | None, audit_key: KeySource | None = None,
               ) -> tuple[AuditSink | None, str | None, bool]:
    """(sink, where, owned): a path or URL becomes a sink the caller owns and closes; a sink is used as given.

    `audit_key` (a private key file, PEM bytes or an Ed25519 key; default ``$PROCTOR_AUDIT_KEY``)
    signs the log's checkpoints, so `proctor audit verify --pubkey` can tell who wrote it.
    """
    if audit is None:
        return None, None, False
    if isinstance(audit, (str, os.PathLike)):
        key = audit_key if audit_key is not None else (os.environ.get(AUDIT_KEY_ENV) or None)
        sink = open_audit(audit, signing_key=key)
        text = os.fspath(audit)
        return sink, (text if scheme_of("audit", text) == "file" else shown_url(text)), True
    path = getattr(audit, "path", None)
    return audit, (os.fspath(path) if path is not None else None), False
