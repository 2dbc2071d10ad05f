"""``proctor serve``: the approval inbox; ``proctor serve token NAME --tokens FILE`` adds an approver.

    proctor serve token alice --tokens tokens.txt [--groups sre-leads]  # prints alice's token (only its hash is kept)
    proctor serve --store sqlite:///runs.db --tokens tokens.txt [--host 127.0.0.1] [--port 8765]
    proctor serve ... --resume --tools tools:TOOLS --policy policy.yaml --model ID
    proctor serve ... --trust-proxy-header X-Forwarded-User --trusted-proxies 1   # behind one proxy
    proctor serve ... --halt-groups sre-leads --audit audit.jsonl [--halts redis://…]  # halt runs from their pages

Exit codes: 0 served (stopped with Ctrl-C) or token added; 2 usage (no store, no token file,
a missing extra).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

__all__ = ["max_body_bytes", "register"]


def max_body_bytes(text: str) -> int:
    """An argparse type: ``--max-body BYTES`` as every server taking one reads it, a whole number of bytes no smaller
    than the request guard takes (`proctor.serve.guard.LOGIN_MAX_BODY`: the login form alone needs that much)."""
    from proctor.serve.guard import LOGIN_MAX_BODY

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of bytes") from None
    if value < LOGIN_MAX_BODY:
        raise argparse.ArgumentTypeError(f"{value}: give at least {LOGIN_MAX_BODY} bytes")
    return value


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("serve", help="the approval inbox: a web page and JSON API over a run store",
                              description="Serve the approval inbox over a run store (see docs/approvals.md).")
    p.add_argument("--store", metavar="URL", default=None, help="the run store (default $PROCTOR_STORE)")
    p.add_argument("--tokens", metavar="FILE", help="the approvers' token file (hashes only)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765)")
    p.add_argument("--trust-proxy-header", metavar="HEADER", default=None,
                   help="take the approver's name from this header set by your authenticating reverse proxy; "
                        "only behind such a proxy")
    p.add_argument("--trusted-proxies", metavar="N", type=int, default=None,
                   help="how many reverse proxies stand before the server: the client's address is the N-th "
                        "X-Forwarded-For entry from the right (default 1 with --trust-proxy-header, else 0: "
                        "the peer's address)")
    p.add_argument("--max-body", metavar="BYTES", type=max_body_bytes, default=None,
                   help="the largest request body taken (default 1 MiB); larger ones are refused with 413 "
                        "before they are read")
    p.add_argument("--openapi", action="store_true",
                   help="serve the API's OpenAPI schema to approvers at /api/openapi.json (no docs page: "
                        "load it in a viewer of your own)")
    p.add_argument("--resume", action="store_true", help="resume suspended runs once their approvals are answered")
    p.add_argument("--tools", metavar="MOD[:ATTR]", action="append", default=[], help="tools, for --resume")
    p.add_argument("--policy", metavar="P", help="the policy file, for --resume")
    p.add_argument("--model", metavar="ID", help="a litellm model id, for --resume")
    p.add_argument("--audit", metavar="LOG|URL",
                   help="the runs' audit trail: resumed runs and halts set from the inbox append to it, and every "
                        "answer the inbox refuses is recorded in it (approval_refused); default as `proctor run`: "
                        "$PROCTOR_AUDIT, else $XDG_STATE_HOME/proctor/audit.jsonl ($PROCTOR_AUDIT for halts)")
    p.add_argument("--answer-key", metavar="FILE", default=None,
                   help="the runs' answer key, which seals every answer the inbox stores (default: "
                        "$PROCTOR_ANSWER_KEY, else derived from --audit's trail; write one with `proctor approvals "
                        "answer-key`)")
    p.add_argument("--halts", metavar="URL", default=None,
                   help="where the fleet's halts are: redis://… (the gates' --ledger) or a run store URL; default: "
                        "the run store, when it is SQLite or PostgreSQL. Active halts are shown on every page")
    p.add_argument("--halt-groups", metavar="A,B", default="",
                   help="approvers in one of these groups (the token file's groups) may halt a run from its page "
                        "(needs --audit); default: nobody")
    from proctor.cli.telemetry import add_telemetry_arguments, telemetered

    add_telemetry_arguments(p)  # the spans of the runs --resume goes on with, as `proctor run`'s
    p.set_defaults(func=telemetered(_serve))
    sub = p.add_subparsers(dest="action", metavar="token", required=False)
    t = sub.add_parser("token", help="add an approver (or replace their token) and print the token")
    t.add_argument("name", metavar="NAME")
    t.add_argument("--tokens", metavar="FILE", required=True, help="the token file (created 0600 if missing)")
    t.add_argument("--groups", metavar="A,B", default="",
                   help="the approver's groups, comma-separated (what a policy's `approvers: {groups: […]}` checks)")
    t.set_defaults(func=_token)


def _token(args: argparse.Namespace) -> int:
    from proctor.approval.tokens import add_token
    from proctor.errors import ProctorError

    try:
        groups = tuple(g.strip() for g in args.groups.split(",") if g.strip())
        token = add_token(args.tokens, args.name, groups)
    except ProctorError as exc:
        print(f"proctor serve token: {exc}", file=sys.stderr)
        return 2
    print(f"approver {args.name} added to {args.tokens}; their token (shown once): {token}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    url = args.store or os.environ.get("PROCTOR_STORE", "")
    if not url:
        print("proctor serve: no run store: pass --store URL or set PROCTOR_STORE", file=sys.stderr)
        return 2
    if not args.tokens:
        print("proctor serve: no token file: pass --tokens FILE (add approvers with `proctor serve token NAME "
              "--tokens FILE`)", file=sys.stderr)
        return 2
    if args.resume and not (args.tools and args.policy and args.model):
        print("proctor serve: --resume needs --tools, --policy and --model (as `proctor runs resume`)",
              file=sys.stderr)
        return 2
    try:
        import uvicorn

        from proctor.serve.app import create_app
    except ImportError as exc:
        print(f"proctor serve: {exc.name} is missing: pip install 'proctor[serve]'", file=sys.stderr)
        return 2
    from proctor.approval.tokens import TokenFile
    from proctor.backends import store_not_yet_made
    from proctor.errors import ProctorError
    from proctor.store.base import RunStore

    try:
        tokens = TokenFile.load(args.tokens)
        fresh = store_not_yet_made(url)
        store = RunStore.open(url)
    except ProctorError as exc:
        print(f"proctor serve: {exc}", file=sys.stderr)
        return 2
    if fresh is not None:  # starting the inbox first is fine; a mistyped path would show no approval, ever
        print(f"proctor serve: no run store at {fresh} yet: created it empty; the agents' --store must name the "
              "same file", file=sys.stderr)
    halt_groups = tuple(g.strip() for g in args.halt_groups.split(",") if g.strip())
    halting = _halting(args, url, halt_groups)
    if isinstance(halting, str):
        print(f"proctor serve: {halting}", file=sys.stderr)
        store.close()
        return 2
    halts, audit = halting
    resumer = _resumer(args, store) if args.resume else None
    from proctor.backends import default_audit_path
    from proctor.serve.guard import DEFAULT_MAX_BODY
    from proctor.store.answerseal import AnswerSeal
    from proctor.store.refusals import AuditTrail, RefusalSink, SinkRefusals

    # Refused answers go to the runs' trail: the sink halts hold open (a file log has one writer), or
    # the trail opened for each refusal.
    trail = args.audit or default_audit_path()
    refusals: RefusalSink = SinkRefusals(audit) if audit is not None else AuditTrail(trail)
    try:
        # Every answer is sealed with the runs' answer key, or the inbox does not start.
        # (A file trail no run has written yet gets its secret now, as the first run would: the same key.)
        seal = AnswerSeal.for_answerer(args.answer_key, trail, create=True)
        app = create_app(store, tokens, proxy_header=args.trust_proxy_header, trusted_proxies=args.trusted_proxies,
                         max_body=args.max_body or DEFAULT_MAX_BODY, resumes=resumer is not None,
                         openapi=args.openapi, halts=halts, audit=audit, halt_groups=halt_groups,
                         refusals=refusals, answers=seal)
    except (ProctorError, ValueError) as exc:
        print(f"proctor serve: {exc}", file=sys.stderr)
        store.close()
        return 2
    print(f"proctor inbox on http://{args.host}:{args.port}/ ({len(tokens.hashes)} approver(s); the token file "
          "is re-read when it changes)", flush=True)
    try:
        if resumer is not None:
            resumer.start()
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        if resumer is not None:
            resumer.stop()
        for opened in (halts, audit):
            if opened is not None:
                opened.close()
        store.close()
    return 0


def _halting(args: argparse.Namespace, store_url: str, groups: tuple[str, ...]) -> tuple[Any, Any] | str:
    """The halt backend the inbox shows (None: none) and the audit sink its halts go to (None without
    --halt-groups); a string says why they cannot be opened."""
    from proctor.errors import ProctorError
    from proctor.halt import HaltError
    from proctor.halt.shared import halts_at, missing_store, open_halt_backend

    url = args.halts
    backend: Any = None
    missing = missing_store(halts_at(url)) if url is not None else None
    if missing is not None:
        return f"--halts {missing}"
    try:
        try:
            backend = open_halt_backend(halts_at(url or store_url))
        except HaltError:
            if url is not None:
                raise
            backend = None  # a run store that keeps no halts (not SQL): none shown unless --halts names them
    except ImportError as exc:
        return f"--halts {url} needs {exc.name or 'redis'}: pip install 'proctor[redis]'"
    except HaltError as exc:
        return f"--halts: {exc}"
    if not groups:
        return backend, None
    if backend is None:
        return "--halt-groups needs where the halts are: --halts URL (this run store keeps none)"
    target = args.audit or os.environ.get("PROCTOR_AUDIT", "")
    if not target:
        backend.close()
        return "--halt-groups needs --audit LOG|URL (or PROCTOR_AUDIT): every halt set from the inbox is audited"
    try:
        from proctor.backends import load_audit

        sink, _, _ = load_audit(target)
    except (ProctorError, OSError) as exc:
        backend.close()
        return f"cannot open the audit log {target}: {exc}"
    if sink is None:
        backend.close()
        return f"cannot open the audit log {target}"
    return backend, sink


def _resumer(args: argparse.Namespace, store: Any) -> Any:
    from proctor.agent.code_agent import CodeAgent
    from proctor.agent.loading import load_tools
    from proctor.agent.models import LiteLLMModel
    from proctor.approval.inbox import InboxApprover
    from proctor.policy import Policy
    from proctor.serve.resumer import Resumer

    tools = load_tools(args.tools)
    policy = Policy.from_yaml(args.policy)

    from proctor.backends import default_audit_path

    audit = args.audit or default_audit_path()  # the runs' trail: its key checks what the store holds

    def make_agent() -> Any:
        return CodeAgent(tools, LiteLLMModel(args.model), policy, approver=InboxApprover(store), audit=audit,
                         store=store)

    return Resumer(store, make_agent)
