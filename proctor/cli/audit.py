"""`proctor audit verify | show | tail | keygen` — registered into the `proctor` command.

Import-light on purpose: `proctor.cli` imports this at start-up, so cryptography,
rich and the verifier are imported inside the command functions.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from proctor.termsafe import terminal_safe

__all__ = ["register"]

_LARGE = 8 << 20  # logs bigger than this get a progress bar (when stderr is a terminal)


def register(subparsers: Any) -> None:
    """Add the `audit` command and its subcommands to the `proctor` parser."""
    audit = subparsers.add_parser("audit", help="verify, show and follow audit logs; make checkpoint keys")
    audit.set_defaults(func=lambda _args: _usage(audit))
    sub = audit.add_subparsers(dest="audit_command", metavar="SUBCOMMAND")

    p = sub.add_parser("verify", help="check chain, checkpoints and anchors; name the first bad record")
    p.add_argument("log", metavar="LOG")
    p.add_argument("--pubkey", metavar="K", help="public key the checkpoints must be signed with")
    p.add_argument("--trusted-checkpoint", metavar="F", help="a checkpoint file saved earlier; the log must extend it")
    p.add_argument("--no-side-file", action="store_true", help="ignore LOG.checkpoint")
    p.add_argument("--workers", type=_workers, default="auto", metavar="N",
                   help="check logs over 8 MiB in N processes, or 'auto': one per usable CPU (default); "
                        "the report is the same either way")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--strict", action="store_true",
                   help="also fail (exit 1) when runs were left open: unfinished runs, intents without an outcome, "
                        "approvals without a resolution, recovery records")
    p.add_argument("--store", metavar="URL",
                   help="also check this run store (sqlite:///PATH or postgresql://…) against the log and report every "
                        "disagreement, one line each naming the run and entry: a seal that does not hold, a grant or "
                        "answer no approval_resolved gave, a call journaled as done that the log never saw end (and "
                        "the reverse for finished runs), an entry or run behind the log, a status that is not the "
                        "log's run_finished; exit 1 on any. The seals' key is the log's (LOG.redact-key beside a "
                        "file log)")
    p.set_defaults(func=_verify)

    p = sub.add_parser("export", help="write a PostgreSQL audit log as JSON Lines (what `verify LOG` reads)")
    p.add_argument("url", metavar="URL", help="postgresql://…?log=NAME")
    p.add_argument("out", metavar="OUT", help="the JSON Lines file to write (its last checkpoint: OUT.checkpoint)")
    p.set_defaults(func=_export)

    p = sub.add_parser("show", help="a table of records, filtered; --run ID: that run step by step",
                       description="A table of the log's records. With --run ID alone, that run step by step "
                       "(thought, program, each call with its decision, approval and outcome), from the log only.")
    p.add_argument("log", metavar="LOG", nargs="?", default=None,
                   help="the log file (default: where `proctor run` writes, $PROCTOR_AUDIT or "
                        "$XDG_STATE_HOME/proctor/audit.jsonl)")
    p.add_argument("--run", metavar="ID", help="that run step by step (with --table or another filter: its records)")
    p.add_argument("--table", action="store_true", help="with --run: the run's records as a table, not its steps")
    p.add_argument("--tool", metavar="T", help="only records of this tool")
    p.add_argument("--agent", metavar="NAME", help="only records of this managed agent (its calls and steps)")
    p.add_argument("--outcome", metavar="O", help="only records whose decision or status is O")
    p.add_argument("--limit", metavar="N", type=int, help="only the last N matching records")
    p.add_argument("--json", action="store_true", help="print the matching records as a JSON array")
    p.add_argument("--wide", action="store_true", help="full ids and times (default: fits 80 columns)")
    p.set_defaults(func=_show)

    p = sub.add_parser("tail", help="print the last records; -f follows the log as it grows")
    p.add_argument("log", metavar="LOG")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new records until Ctrl-C")
    p.add_argument("-n", "--lines", type=int, default=10, metavar="N", help="records to print first (default 10)")
    p.add_argument("--json", action="store_true", help="print raw JSON lines")
    p.set_defaults(func=_tail)

    p = sub.add_parser("keygen", help="make an Ed25519 key pair for signing checkpoints")
    p.add_argument("out", metavar="OUT", help="private key file (mode 0600); the public key goes to OUT.pub")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.set_defaults(func=_keygen)


def _workers(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number of processes ≥ 1 or 'auto', got {text!r}")
    return n


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _err(message: str) -> None:
    print(terminal_safe(f"proctor audit: {message}"), file=sys.stderr)


def _verify(args: argparse.Namespace) -> int:
    import json
    import os

    from proctor.audit.verify import verify
    from proctor.errors import AuditError

    database = args.log.startswith(("postgresql://", "postgres://"))  # exported, then the same verifier
    if not database and not os.path.isfile(args.log):
        _err(f"{args.log}: no such log file")
        return 2
    if args.trusted_checkpoint is not None and not os.path.isfile(args.trusted_checkpoint):
        _err(f"{args.trusted_checkpoint}: no such checkpoint file")
        return 2
    size = 0 if database else os.path.getsize(args.log)
    options: dict[str, Any] = {"pubkey": args.pubkey, "trusted_checkpoint": args.trusted_checkpoint,
                               "side_file": not args.no_side_file, "workers": args.workers}
    try:
        if database:
            try:
                from proctor.audit.postgres import verify_postgres
            except ImportError as exc:
                _err(f"verifying a postgresql:// log needs {exc.name or 'psycopg'}: pip install 'proctor[postgres]'")
                return 2

            report = verify_postgres(args.log, **options)
        elif size > _LARGE and sys.stderr.isatty() and not args.json:
            from rich.console import Console
            from rich.progress import Progress

            with Progress(console=Console(stderr=True), transient=True) as bar:
                task = bar.add_task("verifying", total=size)
                report = verify(args.log, progress=lambda done: bar.update(task, completed=done), **options)
        else:
            report = verify(args.log, **options)
    except AuditError as exc:
        _err(str(exc))
        return 2
    except OSError as exc:
        _err(f"cannot read {args.log}: {exc.strerror or exc}")
        return 1
    strict_failed = report.ok and args.strict and report.run_problems > 0
    code = 0 if report.ok and not strict_failed else 1
    store: dict[str, Any] | None = None
    if args.store is not None:
        store = _check_store(args.log, args.store)
        if store is None:
            return 2
        if store["disagreements"]:
            code = 1
    if args.json:
        out = report.to_dict()
        out["strict"] = bool(args.strict)
        out["run_problems"] = report.run_problems
        if store is not None:
            out["store"] = store
        print(json.dumps(out, indent=2, sort_keys=True))
        return code
    f = report.failure
    if f is None:
        signed = f", {report.signed_checkpoints} signed" if report.signed_checkpoints else ""
        print(terminal_safe(f"{args.log}: intact: {report.records} records, {report.checkpoints} checkpoint(s)"
                            f"{signed}, root {report.root[:16]}…"))
    else:
        where = f"seq {f.seq}" + (f", line {f.line}, byte offset {f.offset}" if f.line is not None else "")
        print(terminal_safe(f"{args.log}: TAMPERED or corrupt: {f.code} at {where}: {f.message}"))
    for warning in report.warnings:
        print(terminal_safe(f"warning: {warning}"))
    if strict_failed:
        print(terminal_safe(f"{args.log}: FAILED (--strict): {report.run_problems} run problem(s) above"))
    if store is not None:
        checked = f"{store['runs']} run(s), {store['entries']} journal entries, {store['approvals']} approval(s)"
        if not store["disagreements"]:
            print(terminal_safe(f"{store['url']}: agrees with the log: {checked}"))
        else:
            print(terminal_safe(f"{store['url']}: DISAGREES with the log: {len(store['disagreements'])} "
                                f"disagreement(s) over {checked}:"))
            for d in store["disagreements"]:
                print(terminal_safe(f"  run {d['run_id']}, {d['entry']}: {d['message']}"))
        if store["takeovers"]:  # what happened, as the log shows it: not the store disagreeing with it
            print(terminal_safe(f"{store['url']}: {len(store['takeovers'])} record(s) of runs taken over by another "
                                "process (not tampering):"))
            for d in store["takeovers"]:
                print(terminal_safe(f"  run {d['run_id']}, {d['entry']}: taken over: {d['message']}"))
    return code


def _check_store(log: str, url: str) -> dict[str, Any] | None:
    """The store named by `url` checked against `log` (`proctor.store.trail.check_store_against_trail`), as the
    report's ``store`` object; None (the reason said) when the store or the log's key cannot be read."""
    from proctor.errors import AuditError, StoreError
    from proctor.store.base import RunStore
    from proctor.store.trail import check_store_against_trail, read_trail
    from proctor.urls import shown_url

    try:
        records, secret = read_trail(log)
    except AuditError as exc:
        _err(str(exc))
        return None
    except OSError as exc:
        _err(f"cannot read {log}: {exc.strerror or exc}")
        return None
    try:
        store = RunStore.open(url, create=False)
    except StoreError as exc:
        _err(f"--store {shown_url(url)}: {exc}")
        return None
    try:
        found, counted = check_store_against_trail(store, records, secret)
    except StoreError as exc:
        _err(f"--store {shown_url(url)}: {exc}")
        return None
    finally:
        store.close()
    shown = shown_url(url) if url.startswith(("postgresql://", "postgres://")) else url
    return {"url": shown, **counted, "disagreements": [d.as_dict() for d in found if not d.takeover],
            "takeovers": [d.as_dict() for d in found if d.takeover]}


def _export(args: argparse.Namespace) -> int:
    from pathlib import Path

    if not args.url.startswith(("postgresql://", "postgres://")):
        _err(f"{args.url}: not a postgresql:// URL (a file log needs no export)")
        return 2
    try:
        from proctor.audit.postgres import export_jsonl
    except ImportError as exc:
        _err(f"exporting a postgresql:// log needs {exc.name or 'psycopg'}: pip install 'proctor[postgres]'")
        return 2
    from proctor.audit.verify import side_file_path
    from proctor.errors import AuditError

    try:
        with Path(args.out).open("wb") as out:
            count = export_jsonl(args.url, out, side_file=side_file_path(args.out))
    except AuditError as exc:
        _err(str(exc))
        return 1
    except OSError as exc:
        _err(f"cannot write {args.out}: {exc.strerror or exc}")
        return 1
    print(f"{args.out}: {count} records")
    return 0


def _decision(rec: dict[str, Any]) -> str:
    if rec.get("status") is not None:
        return str(rec["status"])
    if rec.get("kind") == "approval_resolved" and rec.get("verdict") is not None:
        return str(rec["verdict"])
    if rec.get("kind") == "approval_refused":
        return f"refused {rec.get('decision') or ''}".strip()
    decision = rec.get("decision")
    if isinstance(decision, dict):
        return str(decision.get("outcome", ""))
    return "" if decision is None else str(decision)


def _rules(rec: dict[str, Any]) -> str:
    rules = rec.get("rules")
    decision = rec.get("decision")
    if rules is None and isinstance(decision, dict):
        rules = decision.get("rules")
    return ", ".join(str(r) for r in rules) if isinstance(rules, list) else ""


def _time(rec: dict[str, Any]) -> str:
    import datetime as dt

    ts = rec.get("ts_ns")
    if not isinstance(ts, int):
        return "?"
    moment = dt.datetime.fromtimestamp(ts / 1e9, tz=dt.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _show(args: argparse.Namespace) -> int:
    import os

    if args.log is None:  # the log `proctor run` wrote to when given no --audit
        from proctor.backends import default_audit_path

        args.log = default_audit_path()
        if not os.path.isfile(args.log):
            _err(f"no LOG given and no log at {args.log} (where `proctor run` writes by default); name the log file")
            return 2

    if args.run is not None:
        found = _run_of(args.log, args.run)
        if found is False:
            return 1
        args.run = found or args.run  # no such run: said below, where it is looked for
    if args.run is not None and not (args.table or args.json or args.tool or args.outcome or args.agent
                                     or args.limit is not None):
        return _show_run(args)

    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from proctor.audit.lines import read_records

    try:
        records, bad = read_records(args.log)
    except OSError as exc:
        _err(f"cannot read {args.log}: {exc.strerror or exc}")
        return 1
    if args.limit is not None and args.limit < 0:
        _err("--limit must be ≥ 0")
        return 2
    picked = [
        r for r in records
        if (args.run is None or r.get("run_id") == args.run)
        and (args.tool is None or r.get("tool") == args.tool)
        and (args.agent is None or r.get("agent") == args.agent)
        and (args.outcome is None or _decision(r) == args.outcome)
    ]
    if args.limit is not None:
        picked = picked[len(picked) - args.limit:] if args.limit else []
    if not records and bad:
        _err(f"{args.log}: not an audit log ({bad} unreadable line(s), no record); run `proctor audit verify`")
        return 1
    if args.json:
        import json

        print(json.dumps(picked, indent=2, sort_keys=True))
    else:
        # Default: one record a line at 80 columns (run column only when several runs are shown,
        # long cells cut with an ellipsis); --wide: everything in full, wrapped.
        wide = bool(args.wide)
        console = Console()
        if not wide and console.width < _TABLE_WIDTH:
            _print_lines(console, picked, records, args.log)
            return _bad_lines(bad, args.log)
        runs = {r.get("run_id") for r in picked if r.get("run_id")}
        names = ["seq", "time", "kind", "run", "agent", "tool", "verdict", "approval", "rules"]
        if not wide and len(runs) <= 1:
            names.remove("run")
        if not any(r.get("agent") for r in picked if r.get("kind") != "run_started"):
            names.remove("agent")  # only runs with managed agents name one on their records
        title = f"{args.log if wide else os.path.basename(args.log)}: {len(picked)} of {len(records)} records"
        caption = f"run {next(iter(runs))}" if len(runs) == 1 else None
        table = Table(title=Text(terminal_safe(title)), caption=Text(terminal_safe(caption)) if caption else None,
                      box=box.HEAVY_HEAD if wide else None, pad_edge=False, show_edge=wide, header_style="bold",
                      padding=(0, 1))
        for name in names:
            # Who decided is never cut (an approver's name with an ellipsis says nothing): it wraps.
            whole = wide or name == "approval"
            least = _MIN_WIDTH[name]
            if name == "approval":  # as wide as who decided, within reason; past that it wraps
                least = max([least, *(min(len(_approval(r)), 40) for r in picked)])
            table.add_column(name, justify="right" if name == "seq" else "left", no_wrap=not whole,
                             overflow="fold" if whole else "ellipsis", min_width=None if wide else least,
                             max_width=None if whole else _MAX_WIDTH.get(name))
        for r in picked:
            kind = str(r.get("kind", "?"))
            cell = {"seq": str(r.get("seq", "?")), "time": _time(r) if wide else _time(r)[11:19],
                    "kind": kind if wide else _KIND_SHORT.get(kind, kind),
                    "run": _short_id(r.get("run_id"), wide), "agent": str(r.get("agent") or ""),
                    "tool": str(r.get("tool") or ""),
                    "verdict": _decision(r), "approval": _approval(r), "rules": _rules(r)}
            table.add_row(*(Text(terminal_safe(cell[n])) for n in names))  # record text is data, never markup
        console.print(table)
    return _bad_lines(bad, args.log)


def _bad_lines(bad: int, log: str) -> int:
    if bad:
        _err(f"{bad} unreadable line(s) skipped; run `proctor audit verify {log}`")
        return 1
    return 0


#: Below this width the records table cannot show who decided without cutting it: one block per record.
_TABLE_WIDTH = 80


def _print_lines(console: Any, picked: list[dict[str, Any]], records: list[dict[str, Any]], log: str) -> None:
    """The records for a narrow terminal: a line per record, then its approval and rules on their own
    indented lines, wrapped, never cut."""
    import os

    from rich.padding import Padding
    from rich.text import Text

    console.print(Text(terminal_safe(f"{os.path.basename(log)}: {len(picked)} of {len(records)} records"),
                       style="bold"), overflow="fold")
    several = len({r.get("run_id") for r in picked if r.get("run_id")}) > 1
    for r in picked:
        kind = str(r.get("kind", "?"))
        head = "  ".join(x for x in (f"{r.get('seq', '?'):>4}", _time(r)[11:19], kind, str(r.get("tool") or ""),
                                     _decision(r)) if x)
        console.print(Text(terminal_safe(head)), overflow="fold")
        for label, value in (("run", str(r.get("run_id") or "")), ("approval", _approval(r)), ("rules", _rules(r))):
            if value and (label != "run" or several):
                console.print(Padding(Text(terminal_safe(f"{label}: {value}"), overflow="fold"), (0, 0, 0, 6)))


def _show_run(args: argparse.Namespace) -> int:
    """One run step by step, read from the log alone (`proctor.agent.replay`), printed as `agent.replay()` does."""
    from proctor.agent.render import print_run
    from proctor.agent.replay import run_from_log
    from proctor.errors import AuditError

    try:
        replayed = run_from_log(args.log, args.run)
    except OSError as exc:
        _err(f"cannot read {args.log}: {exc.strerror or exc}")
        return 1
    except AuditError as exc:
        _err(str(exc))
        return 1
    print_run(replayed.result, file=sys.stdout, notes=replayed.notes, whole=True,
              extra=[("read from", f"{args.log} alone: tool results, printed output and the answer's value "
                                   "are not kept in the audit log")])
    from proctor.agent.render import print_timeline
    from proctor.audit.lines import read_records

    try:
        records, _bad = read_records(args.log)
    except OSError as exc:
        _err(f"cannot read {args.log}: {exc.strerror or exc}")
        return 1
    print_timeline([_event(r) for r in records if r.get("run_id") == args.run], file=sys.stdout,
                   title=f"timeline of run {args.run} (from {args.log})")
    if replayed.broken:
        _err(f"the records shown do not all hold in the log's hash chain ({len(replayed.broken)} problem(s), "
             f"first: {replayed.broken[0]}): some may be forged or edited; run `proctor audit verify {args.log}`")
    if replayed.skipped:
        _err(f"{replayed.skipped} unreadable line(s) skipped; run `proctor audit verify {args.log}`")
    return 1 if replayed.skipped or replayed.broken else 0


_MIN_WIDTH = {"seq": 4, "time": 8, "kind": 11, "run": 9, "agent": 6, "tool": 10, "verdict": 9, "approval": 12,
              "rules": 8}
_MAX_WIDTH = {"run": 9, "agent": 12, "tool": 14, "verdict": 10, "approval": 16}
_KIND_SHORT = {"call_intent": "intent", "call_outcome": "outcome", "approval_requested": "appr_asked",
               "approval_resolved": "appr_done", "budget_exhausted": "budget_stop", "worker_started": "worker",
               "run_started": "run_start", "run_finished": "run_end", "run_suspended": "run_pause",
               "run_resumed": "run_resume", "call_replayed": "replayed", "approval_refused": "appr_refused"}


def _run_of(log: str, text: str) -> str | bool | None:
    """The run id `text` names in `log`: itself, or a unique prefix of one (≥ 6 characters); None when it
    names none; False after saying why it cannot be used (an ambiguous or too short prefix, an unreadable log)."""
    from proctor.audit.lines import read_records
    from proctor.errors import StoreError
    from proctor.store.prefix import unique_prefix

    try:
        records, _bad = read_records(log)
    except OSError as exc:
        _err(f"cannot read {log}: {exc.strerror or exc}")
        return False
    ids = [str(r["run_id"]) for r in records if isinstance(r.get("run_id"), str)]
    try:
        return unique_prefix(text, ids, "run")
    except StoreError as exc:
        _err(f"{log}: {exc}")
        return False


def _event(rec: dict[str, Any]) -> tuple[int | None, str, list[str]]:
    """One record of a run as a timeline entry: its time, what happened, and its words in full."""
    import json

    def text(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)

    kind = str(rec.get("kind", "?"))
    ts = rec.get("ts_ns") if isinstance(rec.get("ts_ns"), int) else None
    tool = f" {rec['tool']}" if rec.get("tool") else ""
    details: list[str] = []
    if kind == "call_intent":
        details.append(f"arguments {text(rec.get('args', {}))}")
        decision = rec.get("decision")
        if isinstance(decision, dict):
            details.append(f"decision {decision.get('outcome')} ({_rules(rec) or 'no rule'})"
                           + (f": {decision.get('reason')}" if decision.get("reason") else ""))
        if isinstance(rec.get("approval"), dict) and rec["approval"].get("verdict"):
            details.append(f"approval {_approval(rec)}")
    elif kind == "approval_requested":
        details += [f"arguments {text(rec.get('args', {}))}",
                    f"asked by {_rules(rec) or 'the default'}: {rec.get('reason') or '-'}"]
        if isinstance(rec.get("expires_at_ns"), int):
            details.append(f"deadline {_time({'ts_ns': rec['expires_at_ns']})}")
    elif kind == "approval_resolved":
        details.append(_approval(rec) or str(rec.get("verdict")))
        for key, label in (("answered_at_ns", "answered at"), ("address", "from"), ("auth", "authenticated by")):
            if rec.get(key) is not None:
                details.append(f"{label} {_time({'ts_ns': rec[key]}) if key.endswith('_ns') else rec[key]}")
        details.append(f"reason: {rec.get('reason') or '-'}")
        for key in ("args", "edited_args"):
            if rec.get(key) is not None:
                details.append(f"edited arguments {text(rec[key])}")
        if rec.get("grant"):
            details.append(f"grant {text(rec['grant'])}")
        if rec.get("refused"):
            details.append(f"refused: {rec['refused']}")
    elif kind == "approval_refused":  # an answer the inbox or the CLI refused: who tried what, and why not
        who = f"{rec.get('approver')} ({rec.get('method') or 'unknown'})"
        if rec.get("address"):
            who += f" from {rec['address']}"
        if rec.get("os_user"):
            who += f" as OS user {rec['os_user']}"
        details += [f"{rec.get('decision') or 'an answer'} by {who} refused ({rec.get('code')}): {rec.get('reason')}",
                    f"approval {rec.get('approval_id')}, then {rec.get('approval_status') or 'unknown'}",
                    f"their reason: {rec.get('answer_reason') or '-'}"]
    elif kind == "call_outcome":
        details.append(f"status {rec.get('status')}" + (f": {rec.get('error')}" if rec.get("error") else ""))
    else:
        for key in ("task", "principal", "step", "status", "reason", "error", "pending"):
            if rec.get(key) not in (None, "", []):
                details.append(f"{key} {rec[key] if isinstance(rec[key], str) else text(rec[key])}")
    return ts, f"#{rec.get('seq', '?')} {kind}{tool}", details


def _short_id(value: Any, wide: bool) -> str:
    text = "" if value is None else str(value)
    return text if wide or len(text) <= 10 else "…" + text[-8:]


def _approval(rec: dict[str, Any]) -> str:
    """Who decided an approval, and how: from approval_resolved, or the intent's approval field."""
    source = rec if rec.get("kind") == "approval_resolved" else rec.get("approval")
    if not isinstance(source, dict) or not source.get("verdict"):
        return ""
    who, where = source.get("approver"), source.get("address")
    if who and where:  # the answer's address is its own field; say it where the name is read
        who = f"{who} from {where}"
    return f"{source['verdict']} by {who}" if who else str(source["verdict"])


def _line(rec: dict[str, Any]) -> str:
    parts = [f"{rec.get('seq', '?'):>6}", _time(rec), f"{rec.get('kind', '?'):<18}"]
    for key in ("run_id", "agent", "tool", "call_id"):
        if rec.get(key):
            parts.append(f"{key.removesuffix('_id')}={rec[key]}")
    if _decision(rec):
        parts.append(_decision(rec))
    if _rules(rec):
        parts.append(f"[{_rules(rec)}]")
    if rec.get("kind") == "checkpoint":
        parts.append(f"size={rec.get('size')} root={str(rec.get('root'))[:16]}…")
    return "  ".join(parts)


def _tail(args: argparse.Namespace) -> int:
    from proctor.audit.follow import follow
    from proctor.audit.lines import LongLine

    def emit(raw: bytes | LongLine) -> None:
        import json

        if isinstance(raw, LongLine):
            print(f"(a {raw.length}-byte line at byte {raw.offset} is over the line limit: skipped; "
                  f"run `proctor audit verify`)", flush=True)
            return
        if args.json:
            print(terminal_safe(raw.decode("utf-8", "replace")), flush=True)
            return
        try:
            rec = json.loads(raw)
        except (ValueError, RecursionError):
            print(f"(unreadable line: {raw[:60]!r}…)", flush=True)
            return
        print(terminal_safe(_line(rec) if isinstance(rec, dict) else repr(rec)), flush=True)

    import os
    import time

    if args.follow and not os.path.exists(args.log):
        _err(f"{args.log} does not exist yet; waiting for it (Ctrl-C to stop)")
        try:
            while not os.path.exists(args.log):
                time.sleep(0.2)
        except KeyboardInterrupt:
            return 0
    try:
        follow(args.log, emit, last=max(args.lines, 0), keep_following=args.follow)
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        _err(f"cannot read {args.log}: {exc.strerror or exc}")
        return 1
    return 0


def _keygen(args: argparse.Namespace) -> int:
    from proctor.audit.keys import generate_keypair
    from proctor.errors import AuditError

    try:
        priv, pub, kid = generate_keypair(args.out, force=args.force)
    except AuditError as exc:
        _err(str(exc))
        return 1
    print(f"{kid}\nprivate key: {priv} (mode 0600; keep it with the writer)\npublic key:  {pub} (give it to auditors)")
    return 0
