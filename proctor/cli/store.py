"""``proctor approvals`` and ``proctor runs``: answer pending calls and manage durable runs from a terminal.

    proctor approvals list --store sqlite:///runs.db [--json]
    proctor approvals approve apr_… --as bob [--reason "checked"] [--audit LOG | --answer-key FILE]
    proctor approvals deny apr_… --as bob --reason "not this customer"
    proctor approvals edit apr_… --as bob --args '{"to": "ops@example.com"}'
    proctor approvals answer-key --audit LOG --out FILE   # the runs' answer key alone (mode 0600)
    proctor runs list | show RUN | cancel RUN
    proctor runs resume RUN --tools MOD:ATTR --policy P --model ID [--audit PATH]

The store comes from ``--store URL`` or ``$PROCTOR_STORE``. Ids are printed whole, and any
unique prefix of at least six characters stands for one (an ambiguous prefix is refused,
naming the candidates). Exit codes: 0 done, 1 refused (unknown or ambiguous id, stale
binding, already answered, four eyes) or a resumed run that failed, 2 usage.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proctor.store.base import RunStore

__all__ = ["register"]


def _store_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", metavar="URL", default=None,
                   help="the run store: sqlite:///runs.db, a path, or postgresql://… (default $PROCTOR_STORE)")
    p.add_argument("--json", action="store_true", help="print JSON on stdout")


def _server_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", metavar="URL", default=None,
                   help="go through a `proctor serve` inbox instead of the store (default $PROCTOR_SERVER)")
    p.add_argument("--token", metavar="T", default=None, help="your approver token for --server "
                   "(default $PROCTOR_TOKEN)")


def register(subparsers: Any) -> None:
    """Add ``proctor approvals`` and ``proctor runs``."""
    from proctor.cli.run import key_value
    from proctor.cli.telemetry import add_telemetry_arguments, telemetered

    ap = subparsers.add_parser("approvals", help="list and answer calls waiting for a human (durable runs)",
                               description="Answer approvals filed by InboxApprover in a run store.")
    asub = ap.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = asub.add_parser("list", help="pending approvals, newest first")
    _store_arg(p)
    p.add_argument("--all", action="store_true", help="answered and void ones too")
    p.add_argument("--run", metavar="RUN_ID", help="only this run's")
    _server_arg(p)
    _seal_args(p)
    p.set_defaults(func=_approvals_list)
    p = asub.add_parser("show", help="one approval in full")
    p.add_argument("id", metavar="ID")
    _store_arg(p)
    _server_arg(p)
    _seal_args(p)
    p.set_defaults(func=_approvals_show)
    for verdict, helptext in (("approve", "let the call run"), ("deny", "refuse the call (the program sees why)"),
                              ("edit", "let it run with other arguments (--args)")):
        p = asub.add_parser(verdict, help=helptext)
        p.add_argument("id", metavar="ID")
        _store_arg(p)
        _server_arg(p)
        p.add_argument("--as", dest="approver", metavar="NAME",
                       help="answer as NAME (default: your OS user; only names the policy's approval.os_users "
                       "lets your OS user act as; with --server the token names you)")
        p.add_argument("--reason", metavar="TEXT", default="", help="why (shown to the program on deny)")
        p.add_argument("--audit", metavar="PATH|URL", default=None,
                       help="the run's audit trail, where a refused answer is recorded (approval_refused; default: "
                            "as `proctor run`: $PROCTOR_AUDIT, else $XDG_STATE_HOME/proctor/audit.jsonl; with "
                            "--server the server records it)")
        p.add_argument("--answer-key", metavar="FILE", default=None,
                       help="the run's answer key, which seals the answer (default: $PROCTOR_ANSWER_KEY, else "
                            "derived from --audit's trail)")
        if verdict == "edit":
            p.add_argument("--args", metavar="JSON", required=True, help="the arguments to run with instead")
        p.set_defaults(func=_answer, verdict=verdict)
    p = asub.add_parser("answer-key", help="write the answer key of an audit trail's runs to a file (mode 0600)",
                        description="Write the key that seals answers to the runs of an audit trail, for an inbox "
                                    "or an approver's host that should not hold the trail's own secret "
                                    "(`proctor serve --answer-key FILE`, `proctor approvals approve --answer-key "
                                    "FILE`). It is derived one way from the trail's secret: it cannot seal the run "
                                    "store's entries nor write the trail.")
    p.add_argument("--audit", metavar="PATH|URL", default=None,
                   help="the runs' audit trail (default: as `proctor run`: $PROCTOR_AUDIT, else "
                        "$XDG_STATE_HOME/proctor/audit.jsonl)")
    p.add_argument("--out", metavar="FILE", required=True, help="where to write it (refused if it exists)")
    p.set_defaults(func=_answer_key)

    rp = subparsers.add_parser("runs", help="list, inspect, resume and cancel durable runs",
                               description="Durable runs kept in a run store (CodeAgent(..., store=…)).")
    rsub = rp.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = rsub.add_parser("list", help="runs, most recently updated first, with what each waits for")
    _store_arg(p)
    p.add_argument("--status", metavar="STATUS", help="only runs in this state (suspended, running, done…)")
    p.set_defaults(func=_runs_list)
    p = rsub.add_parser("show", help="one run: its task, steps, calls of the step in progress, what it waits for")
    p.add_argument("id", metavar="RUN_ID")
    _store_arg(p)
    p.set_defaults(func=_runs_show)
    p = rsub.add_parser("cancel", help="end a suspended run; its pending approvals are voided")
    p.add_argument("id", metavar="RUN_ID")
    _store_arg(p)
    p.add_argument("--reason", metavar="TEXT", default="", help="why")
    p.add_argument("--audit", metavar="PATH|URL", default=None,
                   help="the run's audit trail, where the cancel is recorded (run_finished, status cancelled; "
                        "default: as `proctor run`: $PROCTOR_AUDIT, else $XDG_STATE_HOME/proctor/audit.jsonl)")
    p.set_defaults(func=_runs_cancel)
    p = rsub.add_parser("resume", help="go on with a suspended run (or one whose process died)")
    p.add_argument("id", metavar="RUN_ID")
    _store_arg(p)
    p.add_argument("--tools", metavar="MOD[:ATTR]", action="append", required=True, help="tools, as for `run`")
    p.add_argument("--policy", metavar="P", required=True, help="the policy file (a changed one asks again)")
    p.add_argument("--shadow", metavar="P", help="a candidate policy deciding every call beside --policy, as for `run`")
    p.add_argument("--ledger", metavar="URL", default=None,
                   help="where budgets shared between runs live, as the run had it (default $PROCTOR_LEDGER)")
    p.add_argument("--model", metavar="ID", required=True, help="a litellm model id, as for `run`")
    p.add_argument("--model-arg", metavar="KEY=VALUE", action="append", type=key_value, default=[],
                   help="extra litellm argument, as for `run` (api_base=http://localhost:11434 …; repeatable)")
    p.add_argument("--audit-key", metavar="PATH",
                   help="Ed25519 private key (PEM) signing the log's checkpoints, as for `run` "
                        "(default: $PROCTOR_AUDIT_KEY)")
    p.add_argument("--audit", metavar="PATH|URL",
                   help="the run's audit trail, whose key checks the store (default: as `proctor run`: $PROCTOR_AUDIT, "
                        "else $XDG_STATE_HOME/proctor/audit.jsonl)")
    p.add_argument("--agent", choices=("code", "tool-calling"), default="code", help="the agent the run used")
    p.add_argument("--wait", metavar="DURATION", default="0s",
                   help="how long a new approval is waited for before the run suspends again (default 0s)")
    p.add_argument("--max-steps", metavar="N", type=int, default=20, help="stop after N steps (default 20)")
    p.add_argument("--import", dest="imports", metavar="MODULE", action="append", default=[],
                   help="a module programs may import (as the run had)")
    p.add_argument("--sandbox", choices=("auto", "bwrap", "process"), default="auto", help="worker isolation")
    p.add_argument("--timeout", metavar="SECONDS", type=float, default=30.0, help="time limit of one program")
    add_telemetry_arguments(p)
    p.set_defaults(func=telemetered(_runs_resume))  # the resumed run's spans, as `proctor run`'s


# -- helpers -----------------------------------------------------------------------------------------


def _seal_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--audit", metavar="PATH|URL", default=None,
                   help="the runs' audit trail, whose key checks each stored answer's seal (default: as `proctor "
                        "run`: $PROCTOR_AUDIT, else $XDG_STATE_HOME/proctor/audit.jsonl)")
    p.add_argument("--answer-key", metavar="FILE", default=None,
                   help="the runs' answer key, instead of the trail's (default: $PROCTOR_ANSWER_KEY)")


def _answer_checker(args: argparse.Namespace) -> Callable[[Any], str]:
    """How a stored answer is shown beside its approval: '' when its seal holds (or there is no answer), else
    why the gate will not believe it; '(seal not checked: …)' when no key is at hand. The inbox (--server)
    checks seals itself and shows an answer it does not believe as pending."""
    from proctor.backends import default_audit_path
    from proctor.errors import ConfigurationError
    from proctor.store.answerseal import AnswerSeal

    try:
        seal = AnswerSeal.for_answerer(args.answer_key, args.audit or default_audit_path())
    except ConfigurationError as exc:
        unchecked = f"seal not checked: {exc}"
        return lambda a: unchecked if a.answer is not None else ""
    return lambda a: seal.problem(a) or ""


def _open(args: argparse.Namespace) -> Any:
    from proctor.store.base import RunStore

    url = args.store or os.environ.get("PROCTOR_STORE", "")
    if not url:
        raise _Usage("no run store: pass --store URL or set PROCTOR_STORE (e.g. sqlite:///runs.db)")
    return RunStore.open(url, create=False)  # these commands read runs: a mistyped path is no empty store


class _Usage(Exception):
    pass


def _guard(func: Any) -> Any:
    """Run a subcommand: usage problems exit 2, store refusals 1, each with one line on stderr."""

    def run(args: argparse.Namespace) -> int:
        from proctor.errors import ProctorError

        try:
            return int(func(args))
        except _Usage as exc:
            _out(f"proctor {args.command} {args.action}: {exc}", file=sys.stderr)
            return 2
        except ProctorError as exc:
            _out(f"proctor {args.command} {args.action}: {exc}", file=sys.stderr)
            return 1

    run.__name__ = func.__name__
    return run


def _when(ns: int | None) -> str:
    if not ns:
        return "-"
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _short(value: Any, width: int = 60) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def _out(text: str, file: Any = None) -> None:
    """Print a line for a human: ids, tasks, arguments, reasons and names come from models, tools and
    users, so they go through `terminal_safe` (no escape sequence reaches the terminal)."""
    from proctor.termsafe import terminal_safe

    print(terminal_safe(text, keep_newlines=True), file=file)


def _print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, ids: Sequence[int] = (0,)) -> None:
    """A table whose cells wrap instead of being cut; the columns `ids` hold ids, kept whole on one line
    (an id cut with an ellipsis cannot be used). Where the table cannot fit with its ids whole, each row
    is printed as a block instead: the first id, then one ``name  value`` line per column."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from proctor.termsafe import terminal_safe

    wide = not sys.stdout.isatty() and not os.environ.get("COLUMNS", "").isdigit()  # a pipe: room to keep ids
    console = Console(highlight=False, width=160 if wide else None)
    widths = [max([len(h), *(len(terminal_safe(row[i])) for row in rows)]) for i, h in enumerate(headers)]
    needed = sum(widths[i] for i in ids) + 8 * (len(headers) - len(ids)) + 3 * len(headers) + 1
    if needed > console.width:
        label = max(len(h) for h in headers)
        for row in rows:
            console.print(Text(terminal_safe(row[ids[0]]), style="bold"), overflow="fold")
            for i, header in enumerate(headers):
                if i != ids[0]:
                    console.print(Text(f"  {header:<{label}}  {terminal_safe(row[i])}"), overflow="fold")
        return
    table = Table(highlight=False)
    for i, header in enumerate(headers):
        if i in ids:
            table.add_column(header, no_wrap=True, min_width=widths[i], overflow="fold")
        else:
            table.add_column(header, overflow="fold")
    for row in rows:
        table.add_row(*(Text(terminal_safe(cell)) for cell in row))  # data, never rich markup
    console.print(table)


def _approval_id(args: argparse.Namespace, source: Any, text: str) -> str:
    """The approval id `text` names: the id itself or a unique prefix (of the store's or the server's)."""
    from proctor.errors import ApprovalNotFound
    from proctor.serve.client import InboxClient
    from proctor.store.prefix import unique_prefix

    if isinstance(source, InboxClient):
        ids = [str(a.get("id")) for a in source.approvals(status="all")]
    else:
        try:
            return str(source.get_approval(text).id)
        except ApprovalNotFound:
            ids = [a.id for a in source.list_approvals(status=None)]
    found = unique_prefix(text, ids, "approval")
    if found is None:
        raise ApprovalNotFound(f"no approval {text!r} (or starting so) in {getattr(source, 'url', 'the store')}: "
                               "see `proctor approvals list --all`")
    return found


def _run_id(store: Any, text: str) -> str:
    """The run id `text` names: the id itself or a unique prefix."""
    from proctor.errors import RunNotFound
    from proctor.store.prefix import unique_prefix

    try:
        return str(store.get_run(text).run_id)
    except RunNotFound:
        pass
    found = unique_prefix(text, [r.run_id for r in store.list_runs(limit=1_000_000)], "run")
    if found is None:
        raise RunNotFound(f"no run {text!r} (or starting so) in {store.url}: see `proctor runs list`")
    return found


# -- approvals ---------------------------------------------------------------------------------------


@_guard
def _approvals_list(args: argparse.Namespace) -> int:
    client = _client(args)
    if client is not None:
        from proctor.store.base import PendingApproval

        raw = client.approvals(status="all" if args.all else "pending")
        items = [PendingApproval.from_dict(a) for a in raw]
        if args.run:
            from proctor.store.prefix import unique_prefix

            wanted = unique_prefix(args.run, [a.run_id for a in items], "run")
            items = [a for a in items if a.run_id == wanted]
        check: Callable[[Any], str] = _unchecked  # (the server shows an answer it does not believe as pending)
    else:
        store = _open(args)
        try:
            run = _run_id(store, args.run) if args.run else None
            items = store.list_approvals(status=None if args.all else "pending", run_id=run)
        finally:
            store.close()
        check = _answer_checker(args)
    if args.json:
        print(json.dumps([a.as_dict() for a in items], default=str, indent=2))
        return 0
    if not items:
        _out("no pending approvals" if not args.all else "no approvals")
        return 0
    _print_table(("id", "tool", "args", "run", "principal", "rule", "requested", "deadline", "status"),
                 [(a.id, a.tool, _short(a.args), a.run_id, a.principal or "-", ", ".join(a.rules) or "-",
                   _when(a.requested_at_ns), _when(a.expires_at_ns), _status(a, check(a))) for a in items],
                 ids=(0, 3))
    return 0


def _unchecked(a: Any) -> str:
    return ""


def _status(a: Any, problem: str) -> str:
    """An approval's status as a person should read it: an answer whose seal does not hold is no answer."""
    if not problem:
        return str(a.status)
    return f"{a.status} (seal not checked)" if problem.startswith("seal not checked") else f"{a.status}, NOT BELIEVED"


@_guard
def _approvals_show(args: argparse.Namespace) -> int:
    client = _client(args)
    if client is not None:
        from proctor.store.base import PendingApproval

        a = PendingApproval.from_dict(client.approval(_approval_id(args, client, args.id))["approval"])
        problem = ""
    else:
        store = _open(args)
        try:
            a = store.get_approval(_approval_id(args, store, args.id))
        finally:
            store.close()
        problem = _answer_checker(args)(a)
    if args.json:
        print(json.dumps(a.as_dict(), default=str, indent=2))
        return 0
    for line in _approval_lines(a):
        print(line)
    if problem:
        from proctor.termsafe import marked_plain

        print(f"  {'seal' if problem.startswith('seal not checked') else 'NOT BELIEVED'}  {marked_plain(problem)}")
    return 0


def _approval_lines(a: Any) -> list[str]:
    """One approval for a person: the arguments as an approver sees them (clear but for fields hidden from
    approvers), with look-alike and invisible characters marked as the console and the inbox mark them."""
    from proctor.serve.views import hidden_fields
    from proctor.termsafe import marked_plain as m

    shown = dict(a.shown_args) if a.shown_args is not None else dict(a.args)
    lines = [f"approval {m(a.id)}  [{m(a.status)}]",
             f"  call      {m(a.tool)}  side effect: {m(a.side_effect)}"]
    for name, value in shown.items():
        lines.append(f"    {m(name)} = {m(json.dumps(value, ensure_ascii=False, default=str))}")
    hidden = hidden_fields(shown)
    if hidden:
        lines.append(f"  hidden    {', '.join(m(h) for h in hidden)}: the policy hides "
                     f"{'it' if len(hidden) == 1 else 'them'} from approvers (hide_from_approvers)")
    where = f", line {a.line}" + (f" column {a.col + 1}" if a.col is not None else "") if a.line is not None else ""
    if a.line is not None and a.end_line is not None and a.end_line != a.line:
        where += f" to line {a.end_line}"
    lines += [f"  run       {m(a.run_id)}  step {a.step}, call {a.seq + 1}{where}  principal: {m(a.principal or '-')}",
              f"  asked by  {m(', '.join(a.rules) or 'the default')}: {m(a.reason)}",
              f"  requested {_when(a.requested_at_ns)}  deadline {_when(a.expires_at_ns)}",
              f"  binding   {a.binding}"]
    from proctor.serve.views import budget_rows

    for i, row in enumerate(budget_rows(a.budget, a.spend)):
        lines.append(f"  {'budgets' if i == 0 else '':<9} {m(row['budget'])}: {m(row['text'])}")
    if a.answer is not None:
        lines.append(f"  answer    {m(a.answer.verdict)} by {m(a.answer.approver)}"
                     + (f" from {m(a.answer.address)}" if a.answer.address else "")
                     + f" at {_when(a.answer.answered_at_ns)}" + (f": {m(a.answer.reason)}" if a.answer.reason else ""))
        if a.answer.args is not None:
            lines.append("  edited    " + m(json.dumps(a.answer.args, ensure_ascii=False, default=str)))
    return lines


@_guard
def _answer(args: argparse.Namespace) -> int:
    from proctor.approval.answers import answer

    edited: dict[str, Any] | None = None
    if args.verdict == "edit":
        from proctor.jsoninput import loads_bounded

        try:
            edited = loads_bounded(args.args, "--args")  # size and depth bounded: no RecursionError
        except ValueError as exc:
            raise _Usage(f"--args is not usable JSON: {exc}") from None
        if not isinstance(edited, dict):
            raise _Usage("--args must be a JSON object of argument names to values")
    if args.verdict == "deny" and not args.reason:
        raise _Usage("deny needs --reason: the program (and the model) are told why")
    client = _client(args)
    durable = True  # through --server the inbox does not say whether it keeps the run: the resume hint stays
    if client is not None:
        if args.approver:
            raise _Usage("--as does not go with --server: the server knows you by your token")
        if args.audit:
            raise _Usage("--audit does not go with --server: the server records refused answers in its own trail")
        if args.answer_key:
            raise _Usage("--answer-key does not go with --server: the server seals the answers it takes")
        args.id = _approval_id(args, client, args.id)
        binding = client.approval(args.id)["approval"]["binding"]
        data = client.answer(args.id, decision=args.verdict, binding=binding, reason=args.reason, args=edited)
        from proctor.store.base import PendingApproval

        answered = PendingApproval.from_dict(data)
        approver = answered.answer.approver if answered.answer is not None else "?"
    else:
        from proctor.approval.answers import os_identity
        from proctor.backends import default_audit_path
        from proctor.policy.approvers import Answerer, os_account
        from proctor.store.answerseal import AnswerSeal
        from proctor.store.refusals import AuditTrail

        # A refused answer is recorded in the run's trail (the one `proctor run` writes by default), and
        # the answer is sealed with the trail's key for answers (or the --answer-key given): the run's gate
        # believes no other.
        trail = AuditTrail(args.audit or default_audit_path())
        address = f"cli:{_host()}"
        store = _open(args)
        try:
            args.id = _approval_id(args, store, args.id)
            current = store.get_approval(args.id)
            seal = AnswerSeal.for_answerer(args.answer_key, trail.url)
            # The store proves only which OS account runs this command: the answer names it, and --as
            # is taken only where the policy's approval.os_users lets that account act as the name.
            account = os_account()
            # (one no longer pending is refused by answer() for that, the clearer reason)
            who = os_identity(current, account, args.approver, refusals=trail, decision=args.verdict,
                              address=address) if current.status == "pending" else \
                Answerer(args.approver or account, "os-user", None, account)
            approver = who.name
            answered = answer(store, args.id, approver=approver, address=address, decision=args.verdict,
                              binding=current.binding, reason=args.reason, args=edited, method=who.method,
                              groups=who.groups, os_user=who.os_user, refusals=trail, seal=seal)
            durable = _holds_run(store, answered.run_id)
        finally:
            store.close()
    if args.json:
        print(json.dumps(answered.as_dict(), default=str, indent=2))
    elif durable:
        _out(f"{answered.id}: {args.verdict} by {approver} ({answered.tool} of run {answered.run_id}); "
              f"resume it with `proctor runs resume {answered.run_id} …`")
    else:  # a program waiting on the store (`proctor mcp serve --approver inbox`): nothing to resume
        _out(f"{answered.id}: {args.verdict} by {approver} ({answered.tool} of run {answered.run_id}); "
             "the program waiting for it goes on")
    return 0


def _holds_run(store: RunStore, run_id: str) -> bool:
    """Whether the store keeps the run itself (a durable run, resumed with `proctor runs resume`), not only its
    approvals."""
    from proctor.errors import RunNotFound

    try:
        store.get_run(run_id)
    except RunNotFound:
        return False
    return True


@_guard
def _answer_key(args: argparse.Namespace) -> int:
    from proctor.backends import default_audit_path
    from proctor.store.answerseal import AnswerSeal

    seal = AnswerSeal.of_trail(args.audit or default_audit_path())
    seal.write(args.out)
    _out(f"{args.out}: the answer key {seal.key_id} of the runs of {args.audit or default_audit_path()}; give it "
         "to answerers as --answer-key or $PROCTOR_ANSWER_KEY")
    return 0


def _client(args: argparse.Namespace) -> Any:
    """An inbox client when --server (or $PROCTOR_SERVER) is given, else None (the store is used)."""
    url = getattr(args, "server", None) or os.environ.get("PROCTOR_SERVER", "")
    if not url:
        return None
    if getattr(args, "store", None):
        raise _Usage("give --store or --server, not both")
    from proctor.serve.client import InboxClient

    return InboxClient(url, args.token or os.environ.get("PROCTOR_TOKEN", ""))


def _host() -> str:
    import socket

    return socket.gethostname()


# -- runs --------------------------------------------------------------------------------------------


def _waiting(store: Any, record: Any) -> list[Any]:
    if record.status != "suspended":
        return []
    return [a for a in store.list_approvals(status=None, run_id=record.run_id) if a.id in set(record.pending)]


@_guard
def _runs_list(args: argparse.Namespace) -> int:
    store = _open(args)
    try:
        records = store.list_runs(status=args.status)
        rows = [(r, _waiting(store, r)) for r in records]
    finally:
        store.close()
    if args.json:
        print(json.dumps([{"run_id": r.run_id, "status": r.status, "task": r.task, "principal": r.principal,
                           "labels": dict(r.labels), "step": r.step, "updated_at_ns": r.updated_at_ns,
                           "waiting_for": [{"id": a.id, "tool": a.tool, "status": a.status} for a in w]}
                          for r, w in rows], indent=2))
        return 0
    if not rows:
        _out("no runs")
        return 0
    _print_table(("run", "status", "step", "principal", "task", "waiting for", "updated"),
                 [(r.run_id, r.status, str(r.step), r.principal or "-", _short(r.task, 40).strip('"'),
                   ", ".join(f"{a.tool} {a.id} ({a.status})" for a in w) or "-", _when(r.updated_at_ns))
                  for r, w in rows], ids=(0,))
    return 0


@_guard
def _runs_show(args: argparse.Namespace) -> int:
    store = _open(args)
    try:
        record = store.get_run(_run_id(store, args.id))
        waiting = _waiting(store, record)
        journal = store.journal(record.run_id, record.step) if record.step else []
        approvals = store.list_approvals(status=None, run_id=record.run_id)
    finally:
        store.close()
    data: dict[str, Any] = record.as_dict()
    data["waiting_for"] = [{"id": a.id, "tool": a.tool, "status": a.status} for a in waiting]
    data["journal"] = [{"seq": e.seq, "call_id": e.call_id, "tool": e.tool, "state": e.state, "status": e.status,
                        "ts_ns": e.ts_ns} for e in journal]
    data["approvals"] = [a.as_dict() for a in reversed(approvals)]
    if args.json:
        print(json.dumps(data, default=str, indent=2))
        return 0
    from rich.console import Console
    from rich.padding import Padding
    from rich.text import Text

    from proctor.agent.render import print_run, print_timeline
    from proctor.agent.replay import run_from_store
    from proctor.termsafe import terminal_safe

    # The task, the model's text and the calls' arguments are data from users, models and tools: escaped,
    # and wrapped at the terminal's width (or $COLUMNS), never cut.
    wide = not sys.stdout.isatty() and not os.environ.get("COLUMNS", "").isdigit()
    head = Console(highlight=False, width=120 if wide else None)
    head.print(Text(terminal_safe(f"run {record.run_id}  [{record.status}]  agent {record.agent or '-'}  "
                                  f"principal {record.principal or '-'}"), overflow="fold"))
    for line in (f"task     {record.task}", f"policy   {record.policy_sha256}", f"step     {record.step}",
                 f"created  {_when(record.created_at_ns)}", f"updated  {_when(record.updated_at_ns)}"):
        head.print(Padding(Text(terminal_safe(line, keep_newlines=True), overflow="fold"), (0, 0, 0, 2)))
    replayed = run_from_store(record, journal, waiting)
    print_run(replayed.result, file=sys.stdout, notes=replayed.notes, whole=True)
    print_timeline(_store_timeline(record, journal, approvals), file=sys.stdout,
                   title="timeline (from the run store: approvals asked and answered, calls of the current step)")
    return 0


def _args_text(args: Any) -> str:
    return json.dumps(args, ensure_ascii=False, default=str, sort_keys=True)


def _store_timeline(record: Any, journal: Sequence[Any], approvals: Sequence[Any]
                    ) -> list[tuple[int | None, str, list[str]]]:
    """What the store says happened to the run, with times: its start, each approval asked and answered
    (who, from where, why, original and edited arguments), the journal of the step in progress, its state."""
    events: list[tuple[int | None, str, list[str]]] = [
        (record.created_at_ns, "run created", [f"principal {record.principal or '-'}"])]
    for a in approvals:
        shown = a.shown_args if a.shown_args is not None else a.args
        events.append((a.requested_at_ns, f"approval {a.id} asked: {a.tool} (step {a.step}, call {a.seq + 1})",
                       [f"arguments {_args_text(shown)}",
                        f"asked by {', '.join(a.rules) or 'the default'}: {a.reason or '-'}",
                        f"deadline {_when(a.expires_at_ns)}"]))
        if a.answer is not None:
            details = [f"{a.answer.verdict} by {a.answer.approver}"
                       + (f" from {a.answer.address}" if a.answer.address else ""),
                       f"reason: {a.answer.reason or '-'}"]
            if a.answer.args is not None:
                details += [f"original arguments {_args_text(shown)}", f"edited arguments {_args_text(a.answer.args)}"]
            if a.answer.grant is not None:
                details.append(f"grant {_args_text(a.answer.grant)}")
            events.append((a.answer.answered_at_ns or None, f"approval {a.id} answered: {a.answer.verdict}", details))
        elif a.status == "void":
            events.append((None, f"approval {a.id} void", ["the run was cancelled, or asked again"]))
    for e in journal:
        r = e.record or {}
        details = [f"arguments {_args_text(r.get('args', e.args))}"]
        if e.error:
            details.append(f"error: {e.error.get('message', '')}")
        events.append((e.ts_ns or None, f"call {e.tool} {e.call_id}: {e.status or e.state}", details))
    events.append((record.updated_at_ns, f"run {record.status}", [record.error] if record.error else []))
    return sorted(events, key=lambda ev: ev[0] or 0)


@_guard
def _runs_cancel(args: argparse.Namespace) -> int:
    from proctor.backends import default_audit_path
    from proctor.policy.approvers import os_account
    from proctor.store.refusals import AuditTrail

    trail = AuditTrail(args.audit or default_audit_path())
    store = _open(args)
    try:
        args.id = _run_id(store, args.id)
        before = store.get_run(args.id)
        record = store.cancel_run(args.id, args.reason)
    finally:
        store.close()
    if record.status != "cancelled" or before.status == "cancelled":
        _out(f"run {record.run_id} is {record.status}: nothing to cancel", file=sys.stderr)
        return 1
    # The run's ending goes to its trail as its own process writes one, with who ended it: the trail is the
    # record a store writer cannot turn back (a resume of the run's earlier rows put back is refused on it).
    missing = trail.append("run_finished", {
        "run_id": record.run_id, "status": "cancelled", "error": record.error, "steps": before.step,
        "cancelled_by": os_account(), "host": _host(), "pid": os.getpid(), "was": before.status,
    }, of_run=before)
    if missing is not None:  # cancelled all the same (a refused answer is refused all the same): said plainly
        _out(f"run {record.run_id} cancelled, but its audit trail does not record it: {missing}", file=sys.stderr)
        return 0
    from proctor.urls import shown_url

    _out(f"run {record.run_id} cancelled (recorded in {shown_url(trail.url)})")
    return 0


@_guard
def _runs_resume(args: argparse.Namespace) -> int:
    from proctor.agent.base import AgentBase
    from proctor.agent.code_agent import CodeAgent
    from proctor.agent.loading import ToolLoadError, load_tools
    from proctor.agent.models import LiteLLMModel
    from proctor.agent.tool_calling import ToolCallingAgent
    from proctor.approval.inbox import InboxApprover
    from proctor.policy import Policy
    from proctor.policy.reload import PolicySource

    try:
        tools = load_tools(args.tools)
    except ToolLoadError as exc:
        raise _Usage(str(exc)) from None
    policy = PolicySource(args.policy)  # reloaded when the file changes during the run, as a gate's path is
    shadow = Policy.from_yaml(args.shadow) if args.shadow else None
    store = _open(args)
    try:
        args.id = _run_id(store, args.id)
    except BaseException:
        store.close()
        raise
    model = LiteLLMModel(args.model, **dict(args.model_arg))
    approver = InboxApprover(store, wait=args.wait)
    from proctor.backends import default_audit_path

    args.audit = args.audit or default_audit_path()
    agent: AgentBase
    if args.agent == "code":
        agent = CodeAgent(tools, model, policy, approver=approver, audit=args.audit, max_steps=args.max_steps,
                          authorized_imports=args.imports, sandbox=args.sandbox, timeout=args.timeout, store=store,
                          shadow=shadow, ledger=args.ledger, audit_key=args.audit_key)
    else:
        agent = ToolCallingAgent(tools, model, policy, approver=approver, audit=args.audit,
                                 max_steps=args.max_steps, store=store, shadow=shadow, ledger=args.ledger,
                                 audit_key=args.audit_key)
    try:
        with agent:
            result = agent.resume(args.id)
    finally:
        store.close()
    if args.json:
        print(json.dumps(result.as_dict(), default=str, indent=2))
    else:
        _out(f"run {result.run_id}: {result.status}" + (f": {result.answer!r}" if result.status == "done" else "")
              + (f" ({result.error})" if result.error else ""))
    return 0 if result.status in ("done", "suspended") else 1
