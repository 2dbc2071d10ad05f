"""`proctor halt`: stop matching calls on every gate sharing a backend; list and lift halts.

    proctor halt --all | --agent A | --tool T | --principal P | --run R --reason TEXT [--ledger redis://… | --store URL]
    proctor halt --lift ID --reason TEXT
    proctor halt --list [--json]

The backend is `--ledger` (Redis) or `--store` (SQLite or PostgreSQL run store), else
``$PROCTOR_LEDGER`` (a redis:// URL) or ``$PROCTOR_STORE``. Setting and lifting are audited
(`halt_set`, `halt_lifted`: the halt, who — the OS user — and why) in `--audit` or
``$PROCTOR_AUDIT``. A halt is set first and then audited: stopping calls is never the
dangerous direction, and if the record fails the command says so and exits 1 with the halt
in force. A lift is audited first and happens only once its record is written.

Exit codes: 0 done (the new halt's id is the last word printed); 1 refused or failed; 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from proctor.termsafe import terminal_safe

if TYPE_CHECKING:
    from proctor.audit.base import AuditSink
    from proctor.halt import HaltBackend, Scope

_SCOPED: tuple[Scope, ...] = ("agent", "tool", "principal", "run")

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("halt", help="stop matching calls on every gate sharing a ledger or store; "
                                           "list and lift halts")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--all", action="store_true", help="halt every call")
    what.add_argument("--agent", metavar="A", help="halt the calls of agent A (a name or a glob: 'research*')")
    what.add_argument("--tool", metavar="T", help="halt calls of tool T (a name or a glob: 'send_*')")
    what.add_argument("--principal", metavar="P",
                      help="halt the calls of runs started by P (a name or a glob: '*@contractor.example')")
    what.add_argument("--run", metavar="R", help="halt the calls of run R")
    what.add_argument("--lift", metavar="ID", help="end the halt ID")
    what.add_argument("--list", action="store_true", help="show the active halts")
    p.add_argument("--reason", metavar="TEXT", help="why (required to set or lift a halt; the program sees it)")
    backend = p.add_mutually_exclusive_group()
    backend.add_argument("--ledger", metavar="redis://…", help="the fleet's Redis (default $PROCTOR_LEDGER)")
    backend.add_argument("--store", metavar="URL", help="a SQLite or PostgreSQL run store (default $PROCTOR_STORE)")
    p.add_argument("--audit", metavar="LOG|URL", help="the audit log recording halts (default $PROCTOR_AUDIT)")
    p.add_argument("--json", action="store_true", help="--list: print a JSON list")
    p.set_defaults(func=_halt, halt_parser=p)


def _err(message: str) -> None:
    print(terminal_safe(message), file=sys.stderr)


def _usage(args: argparse.Namespace, message: str) -> int:
    args.halt_parser.print_usage(sys.stderr)
    _err(f"proctor halt: {message}")
    return 2


def _backend(args: argparse.Namespace) -> HaltBackend | str:
    """The backend named on the command line or by the environment; a string says why there is none."""
    from proctor.halt import HaltError
    from proctor.halt.shared import REDIS_SCHEMES, halts_at, missing_store, open_halt_backend

    url = args.ledger or args.store
    kind = "ledger" if args.ledger else "store" if args.store else None
    if url is None:
        env_ledger = os.environ.get("PROCTOR_LEDGER", "")
        if env_ledger.startswith(REDIS_SCHEMES):
            url, kind = env_ledger, "ledger"
        elif os.environ.get("PROCTOR_STORE"):
            url, kind = os.environ["PROCTOR_STORE"], "store"
    if url is None:
        return "name the backend the gates share: --ledger redis://… or --store URL (or set PROCTOR_LEDGER / " \
               "PROCTOR_STORE)"
    at = halts_at(url)
    if kind == "ledger" and at[0] != "redis":
        return f"--ledger {url}: halts are shared through Redis (redis://…); a run store is --store"
    missing = missing_store(at)
    if missing is not None:
        return f"--store {missing}"
    try:
        return open_halt_backend(at)
    except ImportError as exc:
        return f"--ledger needs {exc.name or 'redis'}: pip install 'proctor[redis]'"
    except HaltError as exc:
        return str(exc)


def _halt(args: argparse.Namespace) -> int:
    from proctor.halt import HaltError, new_halt, operator

    scope_value: list[tuple[Scope, str]] = [(s, getattr(args, s)) for s in _SCOPED if getattr(args, s)]
    if not (args.all or scope_value or args.lift or args.list):
        return _usage(args, "say what to halt (--all, --agent, --tool, --principal, --run), or --lift ID, or --list")
    if (args.all or scope_value or args.lift) and not (args.reason and args.reason.strip()):
        return _usage(args, "--reason TEXT is required: the audit log keeps why the halt was lifted" if args.lift
                      else "--reason TEXT is required: the program refused sees it, and the audit log keeps it")
    audit_target: str = args.audit or os.environ.get("PROCTOR_AUDIT") or ""
    if not args.list and not audit_target:
        return _usage(args, "--audit LOG|URL (or PROCTOR_AUDIT) is required: every halt and lift is audited")
    backend = _backend(args)
    if isinstance(backend, str):
        if backend.startswith("name the backend") or backend.startswith("--ledger"):
            return _usage(args, backend)
        _err(backend)
        return 1
    try:
        if args.list:
            return _list(backend, args.json)
        who = operator()
        sink = _open_audit(audit_target)
        if isinstance(sink, str):
            _err(sink)
            return 1
        try:
            if args.lift:
                return _lift(backend, sink, args.lift, args.reason, who)
            target: tuple[Scope, str | None] = ("all", None) if args.all else scope_value[0]
            scope, value = target
            try:
                halt = new_halt(scope, value, args.reason, who)
                backend.set(halt)
            except HaltError as exc:
                _err(f"proctor halt: {exc}")
                return 1
            result = sink.append("halt_set", {**halt.as_dict(), "halt_id": halt.id, "backend": backend.shown})
            if not result.ok:
                _err(f"halt {halt.id} IS IN FORCE but the audit log could not record it: {result.error}; "
                     f"lift it with `proctor halt --lift {halt.id}` once the log is writable, or record it by hand")
                return 1
            print(terminal_safe(f"halted {halt.target} on {backend.shown}: {halt.reason}"))
            print(halt.id)
            return 0
        finally:
            sink.close()
    finally:
        backend.close()


def _open_audit(target: str) -> AuditSink | str:
    from proctor.errors import ProctorError

    try:
        from proctor.backends import load_audit

        sink, _, _ = load_audit(target)
    except (ProctorError, OSError) as exc:
        return f"cannot open the audit log {terminal_safe(target)}: {exc}"
    if sink is None:
        return f"cannot open the audit log {terminal_safe(target)}"
    return sink


def _lift(backend: HaltBackend, sink: AuditSink, halt_id: str, reason: str, who: str) -> int:
    from proctor.halt import HaltError

    try:
        found = {h.id: h for h in backend.list_halts()}.get(halt_id)
    except HaltError as exc:
        _err(f"proctor halt: {exc}")
        return 1
    if found is None:
        _err(f"proctor halt: no active halt {halt_id!r} on {backend.shown} (proctor halt --list shows them)")
        return 1
    result = sink.append("halt_lifted", {"halt_id": halt_id, "scope": found.scope, "value": found.value,
                                         "reason": reason, "by": who, "halt_reason": found.reason,
                                         "backend": backend.shown})
    if not result.ok:
        _err(f"not lifted: the audit log could not record the lift: {result.error}")
        return 1
    try:
        backend.lift(halt_id, reason=reason, by=who)
    except HaltError as exc:
        _err(f"proctor halt: the lift of {halt_id} is recorded but did not happen: {exc}")
        return 1
    print(terminal_safe(f"lifted {halt_id} ({found.target}) on {backend.shown}"))
    return 0


def _list(backend: HaltBackend, as_json: bool) -> int:
    from proctor.halt import HaltError

    try:
        halts = backend.list_halts()
    except HaltError as exc:
        _err(f"proctor halt: {exc}")
        return 1
    if as_json:
        print(json.dumps([h.as_dict() for h in halts], ensure_ascii=False, sort_keys=True))
        return 0
    if not halts:
        print(terminal_safe(f"no active halts on {backend.shown}"))
        return 0
    for h in halts:
        when = datetime.fromtimestamp(h.at_ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
        print(terminal_safe(f"{h.id}  {h.target}  by {h.by} at {when}: {h.reason}"))
    return 0
