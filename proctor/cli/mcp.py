"""``proctor mcp serve``: the governed code-mode MCP server (docs/code-mode.md).

    proctor mcp serve --servers servers.json --policy policy.yaml --audit audit.jsonl        # stdio
    proctor mcp serve --servers servers.json --policy policy.yaml --http 127.0.0.1:8765 --tokens tokens.txt

Exit status: 0 after a clean end, 1 when the policy, a server or the audit trail cannot be used, 2 usage.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from proctor.termsafe import terminal_safe

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``proctor mcp serve`` to the command line."""
    from proctor.cli.run import key_value
    from proctor.cli.serve import max_body_bytes
    from proctor.cli.telemetry import add_telemetry_arguments, telemetered

    p = subparsers.add_parser("mcp", help="MCP: serve governed code mode to MCP clients",
                              description="Model Context Protocol commands.")
    sub = p.add_subparsers(dest="mcp_command", metavar="COMMAND")
    s = sub.add_parser(
        "serve", help="an MCP server offering run_python, search_tools and describe_tool, every call governed",
        description="Serve governed code mode: the client's model writes Python that calls the upstream MCP "
        "servers' tools (and local tools) as functions; every call is decided by the policy, approved when it "
        "says so (MCP elicitation when the client supports it), audited and traced. One MCP session is one run.")
    s.add_argument("--servers", metavar="FILE", required=True,
                   help='upstream MCP servers, in the clients\' {"mcpServers": {...}} layout')
    s.add_argument("--policy", metavar="P", required=True, help="the policy file (YAML)")
    s.add_argument("--shadow", metavar="P",
                   help="a candidate policy that decides every call beside --policy and never acts: where it "
                        "disagrees, a shadow_decision record (docs/operations.md)")
    s.add_argument("--tools", metavar="MOD[:ATTR]", action="append", default=[],
                   help="local tools offered beside the upstream ones (repeatable)")
    s.add_argument("--audit", metavar="PATH|URL", help="the audit trail: a file, or postgresql://…?log=NAME "
                   "(default: $PROCTOR_AUDIT, else ~/.local/state/proctor/audit.jsonl)")
    s.add_argument("--store", metavar="URL", help="a run store: with --approver inbox, approvals the client "
                   "cannot be asked go to its inbox (proctor serve, proctor approvals)")
    s.add_argument("--ledger", metavar="URL", default=None,
                   help="where budgets counted across runs live (per principal: across a user's sessions): "
                        "redis://host:6379/0 for a fleet (default $PROCTOR_LEDGER, else this process)")
    s.add_argument("--halts", metavar="URL", default=None,
                   help="where the fleet's halts are (what `proctor halt --ledger/--store` sets): redis://… or a "
                        "SQLite/PostgreSQL run store URL, and only there; default: those of --store and of a "
                        "Redis --ledger, and this process's own")
    s.add_argument("--approver", metavar="SPEC", default=None,
                   help="who answers approvals when the client does not support elicitation: webhook:URL "
                        "or inbox (with --store); default: such calls are denied")
    s.add_argument("--http", metavar="HOST:PORT", help="serve streamable HTTP at http://HOST:PORT/mcp "
                   "(needs --tokens) instead of stdio")
    s.add_argument("--tokens", metavar="FILE", help="bearer tokens (as `proctor serve token NAME --tokens FILE` "
                   "makes them): a token's name is the session's principal")
    s.add_argument("--session-idle", metavar="DURATION", default="30m",
                   help="with --http: end a session's run (run_finished status abandoned) after this long "
                        "without a request, for a client that went away without deleting its session "
                        "(default 30m; 'off' keeps sessions until the server stops)")
    s.add_argument("--max-sessions-per-principal", metavar="N", default=None,
                   help="with --http: the most MCP sessions one token's owner may hold open at once; one more is "
                        "refused (HTTP 429, saying so) until one ends or is ended after --session-idle (default 16; "
                        "'off' for no bound beyond the MCP SDK's own)")
    s.add_argument("--max-body", metavar="BYTES", type=max_body_bytes, default=None,
                   help="with --http: the largest request body taken; a larger one is refused (HTTP 413) before "
                        "more of it is read (default 16 MiB)")
    s.add_argument("--user", metavar="NAME", help="the principal of the stdio session (default: $USER)")
    s.add_argument("--label", metavar="KEY=VALUE", action="append", type=key_value, default=[],
                   help="a label of every session's run (policy: run.labels; repeatable); proctor sets "
                        "via=mcp-code-mode itself")
    s.add_argument("--audit-key", metavar="PATH",
                   help="Ed25519 private key (PEM) signing the audit log's checkpoints (default: $PROCTOR_AUDIT_KEY)")
    s.add_argument("--sandbox", choices=("auto", "bwrap", "process"), default="auto",
                   help="worker isolation (default auto: bwrap when available)")
    s.add_argument("--timeout", metavar="SECONDS", type=float, default=30.0,
                   help="time limit of one program (default 30)")
    s.add_argument("--import", dest="imports", metavar="MODULE", action="append", default=[],
                   help="a module programs may import (repeatable)")
    add_telemetry_arguments(s)  # a span per call, over OTLP (stdout stays the MCP channel: logs go to stderr)
    s.set_defaults(func=telemetered(serve))  # spans exported as `proctor run`'s, flushed when it stops
    p.set_defaults(func=lambda args: (p.print_help(sys.stderr), 2)[1])


def _fail(message: str, code: int) -> int:
    print(terminal_safe(f"proctor mcp serve: {message}"), file=sys.stderr)
    return code


def serve(args: argparse.Namespace) -> int:
    from proctor.agent.loading import ToolLoadError, load_tools
    from proctor.backends import default_audit_path, load_audit
    from proctor.errors import AuditError, ConfigurationError, HaltError, PolicyError, ToolsetError

    if args.http and not args.tokens:
        return _fail("--http needs --tokens FILE (make one with `proctor serve token NAME --tokens FILE`)", 2)
    if args.tokens and not args.http:
        return _fail("--tokens is for --http; stdio's principal is --user", 2)
    host, port = "", 0
    if args.http:
        host, sep, port_text = args.http.rpartition(":")
        if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            return _fail(f"--http {args.http!r}: expected HOST:PORT, e.g. 127.0.0.1:8765", 2)
        port = int(port_text)
    try:
        from proctor.codemode.config import load_servers
        from proctor.codemode.server import (
            DEFAULT_MAX_BODY,
            DEFAULT_MAX_SESSIONS_PER_PRINCIPAL,
            CodeMode,
            serve_http,
            serve_stdio,
        )

        servers = load_servers(args.servers)
        tools = load_tools(args.tools) if args.tools else []
        approver = _approver(args)
        session_idle = _session_idle(args.session_idle)
        max_sessions = DEFAULT_MAX_SESSIONS_PER_PRINCIPAL if args.max_sessions_per_principal is None \
            else _max_sessions(args.max_sessions_per_principal)
        max_body = DEFAULT_MAX_BODY if args.max_body is None else args.max_body
        if args.max_body is not None and not args.http:
            raise ConfigurationError("--max-body is for --http")
        halts = _halts(args)
        tokens = None
        if args.tokens:
            from proctor.approval.tokens import TokenFile

            tokens = TokenFile.load(args.tokens)
    except (ToolLoadError, ConfigurationError, ValueError) as exc:
        return _fail(str(exc), 2)
    except HaltError as exc:
        return _fail(f"--halts: {exc}", 1)
    except ImportError as exc:
        return _fail(f"{exc} (pip install 'proctor[mcp]')", 2)
    try:
        from proctor.policy import Policy
        from proctor.policy.reload import PolicySource

        policy = PolicySource(args.policy)  # reloaded when the file changes (a bad new file is refused, logged)
        shadow = Policy.from_yaml(args.shadow) if args.shadow else None
    except PolicyError as exc:
        print(terminal_safe(str(exc), keep_newlines=True), file=sys.stderr)
        return 1
    listener = None
    if args.http:  # bound before any upstream starts: a port another server holds fails here, in one line
        from proctor.codemode.server import listen

        try:
            listener = listen(host, port)
        except OSError as exc:
            return _fail(f"--http {host}:{port}: cannot listen there: {exc.strerror or exc} (another server "
                         "holds that port? stop it, or serve on another)", 1)
    try:
        try:
            audit, _, _ = load_audit(args.audit or default_audit_path(), args.audit_key)
            code_mode = CodeMode(servers, policy, local_tools=tools, audit=audit, approver=approver, user=args.user,
                                 sandbox=args.sandbox, timeout=args.timeout, authorized_imports=args.imports,
                                 session_idle=session_idle, halts=halts, shadow=shadow, ledger=args.ledger,
                                 labels={k: str(v) for k, v in args.label}, max_sessions_per_principal=max_sessions)
            if halts is None and args.store:  # the store's halts, beside the gate's own and its ledger's
                _honour_store_halts(code_mode, args.store)
            try:
                code_mode.open()
            except ToolsetError as exc:  # an upstream did not start: its entry is in the servers file
                return _fail(f"{args.servers}: {exc}", 1)
        except (ToolsetError, AuditError, ConfigurationError) as exc:
            return _fail(str(exc), 1)
        for name, why in code_mode.withheld.items():  # whatever --log-level says: the operator has a server to fix
            print(terminal_safe(f"proctor mcp serve: {name} is not offered: {why}"), file=sys.stderr)
        try:
            if args.http:
                print(f"proctor mcp serve: http://{host}:{port}/mcp ({len(code_mode.tools)} tools)", file=sys.stderr)
                serve_http(code_mode, host, port, tokens, listener=listener, max_body=max_body)
            else:
                serve_stdio(code_mode)
        finally:
            if audit is not None:
                audit.close()
            if halts is not None:
                halts.close()
    finally:
        if listener is not None:
            listener.close()
    return 0


def _halts(args: argparse.Namespace) -> Any:
    """The halt channel the gate honours, and it alone, when --halts names one; else None: the gate's own
    default (this process's halts and its Redis ledger's), joined by the --store's. `HaltError` when --halts
    cannot be used."""
    from proctor.halt import HaltError
    from proctor.halt.shared import halts_at, missing_store, open_halts

    if args.halts is None:
        return None
    at = halts_at(args.halts)
    missing = missing_store(at)  # a mistyped path would be a fresh store: an empty table honoured
    if missing is not None:
        raise HaltError(missing)
    return open_halts(at)


def _honour_store_halts(code_mode: Any, store: str) -> None:
    from proctor.halt import HaltError
    from proctor.halt.shared import halts_at

    try:
        at = halts_at(store)
    except HaltError:
        return  # a run store that keeps no halts (not SQL): nothing to honour there
    code_mode.gate.honour_halts_at(at)


def _session_idle(text: str) -> float | None:
    if text.strip().lower() in ("off", "none", "never"):
        return None
    from proctor.policy.validators import parse_duration

    try:
        seconds = parse_duration(text)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--session-idle {text!r}: {exc}") from None
    if not seconds > 0:
        raise ValueError(f"--session-idle {text!r}: must be longer than 0s, or 'off'")
    return seconds


def _max_sessions(text: str) -> int | None:
    if text.strip().lower() in ("off", "none"):
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"--max-sessions-per-principal {text!r}: a whole number of sessions, at least 1, or 'off'")
    return int(text)


def _approver(args: argparse.Namespace) -> Any:
    if args.approver is None:
        return None
    if args.approver == "inbox":
        if not args.store:
            raise ValueError("--approver inbox needs --store URL (the run store whose inbox answers)")
        from proctor.approval.inbox import InboxApprover
        from proctor.store import RunStore

        return InboxApprover(RunStore.open(args.store), wait="5m")
    from proctor.approval.spec import approver_from_spec

    if args.approver == "console":
        raise ValueError("--approver console cannot work here: stdin and stdout carry the MCP session")
    return approver_from_spec(args.approver)
