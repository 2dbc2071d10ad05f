"""`proctor policy replay | coverage`: a policy judged against an audit log (registered by `proctor.cli.policy`).

Both check the log's hash chain first (as `proctor audit verify` does) and say when it is not intact:
a record edited, deleted or moved is otherwise read as written.

Exit codes: replay 0 (1 with ``--fail-on-change`` when any decision changed, with ``--fail-on-undecidable``
when any recorded call could not be decided again, and with either when lines of the log were not records
or its chain is broken; stderr says which), coverage 0;
1 when the policy or the log cannot be read; 2 usage. Heavy imports happen in the commands.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from datetime import datetime, timezone
from typing import Any

from proctor.termsafe import terminal_safe

__all__ = ["parse_since", "register"]

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def register(sub: Any) -> None:
    """Add `replay` and `coverage` to the `policy` subcommands."""
    audit_help = "the audit log: a JSONL path or postgresql://…?log=NAME"
    replay = sub.add_parser("replay", help="decide every recorded call of an audit log again under a new policy "
                                           "and report the decisions that would change")
    replay.add_argument("policy", metavar="NEW.yaml")
    replay.add_argument("--audit", required=True, metavar="LOG|URL", help=audit_help)
    replay.add_argument("--since", default=None, metavar="T",
                        help="count only calls recorded at or after T: an ISO date or time (UTC unless it says), "
                             "or an age such as 24h, 7d")
    replay.add_argument("--json", action="store_true", help="print the report as one JSON object")
    replay.add_argument("--fail-on-change", dest="fail_on_change", action="store_true",
                        help="exit 1 when any decision would change, or lines of the log are not records, or "
                             "its hash chain is broken (gate a policy change in CI)")
    replay.add_argument("--fail-on-undecidable", dest="fail_on_undecidable", action="store_true",
                        help="exit 1 when any recorded call could not be decided again (its arguments redacted, "
                             "its run's start not in the log…), or lines of the log are not records, or its hash "
                             "chain is broken: with --fail-on-change, a CI gate that passes only when every "
                             "call was decided and none changed")
    replay.add_argument("--pubkey", metavar="K", help="the log writer's public key: its checkpoints must be signed "
                                                      "with it (as `proctor audit verify --pubkey`)")
    replay.set_defaults(func=_replay)

    coverage = sub.add_parser("coverage", help="which rules an audit log's calls matched, which budgets they "
                                               "approached, which tools the policy does not declare")
    coverage.add_argument("policy", metavar="P")
    coverage.add_argument("--audit", required=True, metavar="LOG|URL", help=audit_help)
    coverage.add_argument("--since", default=None, metavar="T", help="as for replay")
    coverage.add_argument("--json", action="store_true", help="print the report as one JSON object")
    coverage.add_argument("--pubkey", metavar="K", help="as for replay")
    coverage.set_defaults(func=_coverage)


def parse_since(text: str, now_s: float | None = None) -> int:
    """`--since`: an ISO 8601 date or time (UTC when it names no zone), or an age (``90m``, ``24h``, ``7d``);
    ns since the epoch. Raises ValueError naming the accepted forms."""
    text = text.strip()
    found = _RELATIVE.match(text)
    if found is not None:
        now = time.time() if now_s is None else now_s
        return int((now - float(found.group(1)) * _UNITS[found.group(2)]) * 1e9)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--since {text!r}: not an ISO date or time (2026-01-31, 2026-01-31T12:00:00+00:00) "
                         "nor an age (90m, 24h, 7d)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1_000_000) * 1000


def _err(message: str) -> None:
    print(terminal_safe(message), file=sys.stderr)


def _inputs(args: argparse.Namespace) -> tuple[Any, int | None] | int:
    """The policy and `--since`, or an exit code after saying what is wrong."""
    from proctor.errors import PolicyError
    from proctor.policy import Policy

    since = None
    if args.since is not None:
        try:
            since = parse_since(args.since)
        except ValueError as exc:
            _err(f"proctor policy {args.policy_command}: {exc}")
            return 2
    try:
        return Policy.from_yaml(args.policy), since
    except PolicyError as exc:
        _err(str(exc))
        return 1
    except OSError as exc:
        _err(f"{args.policy}: cannot read the policy: {exc.strerror or exc}")
        return 1


def _read_failure(args: argparse.Namespace, exc: Exception) -> int:
    _err(f"{terminal_safe(args.audit)}: cannot read the audit log: {exc}")
    return 1


def _replay(args: argparse.Namespace) -> int:
    from proctor.errors import AuditError
    from proctor.policy.replay import replay_log

    got = _inputs(args)
    if isinstance(got, int):
        return got
    policy, since = got
    try:
        report = replay_log(policy, args.audit, since_ns=since, pubkey=args.pubkey)
    except (OSError, AuditError) as exc:
        return _read_failure(args, exc)
    out = report.as_dict()
    if args.json:
        print(json.dumps(out, ensure_ascii=False, sort_keys=True))
    else:
        _print_replay(out, args.policy, args.audit)
    failures = _gate_failures(out, fail_on_change=args.fail_on_change,
                              fail_on_undecidable=args.fail_on_undecidable)
    for failure in failures:
        _err(f"proctor policy replay: {failure}")
    return 1 if failures else 0


def _gate_failures(out: dict[str, Any], *, fail_on_change: bool, fail_on_undecidable: bool) -> list[str]:
    """Why a replay run as a gate (`--fail-on-change`, `--fail-on-undecidable`) fails, one line each; [] passes."""
    if not (fail_on_change or fail_on_undecidable):
        return []
    found = []
    if fail_on_change and out["changed"]:
        found.append(f"{out['changed']} recorded decision(s) would change (--fail-on-change)")
    if fail_on_undecidable and out["undecidable"]:
        reasons = "; ".join(f"{count}: {why}" for why, count in out["undecidable_why"].items())
        found.append(f"{out['undecidable']} recorded call(s) could not be decided again, so this report says "
                     f"nothing of what the policy would do to them (--fail-on-undecidable): {reasons}")
    # Lines that are not records hold calls nobody decided again, and a broken chain means the records may not be
    # the calls that were made: neither "nothing changed" nor "every call was decided" can be said of either.
    if out["bad_lines"]:
        found.append(f"{out['bad_lines']} line(s) of the log are not records: the calls they held were not decided "
                     "again (run `proctor audit verify`)")
    if out["log_intact"] is False:
        found.append(f"the log is not intact ({out['log_failure']}): its records may not be the calls that were "
                     "made (run `proctor audit verify`)")
    return found


def _not_intact(out: dict[str, Any], audit: str) -> None:
    if out["log_intact"] is False:
        print(terminal_safe(f"  THE LOG IS NOT INTACT: {out['log_failure']}; its records were read as written, so "
                            f"this report cannot vouch for the calls they claim (run `proctor audit verify {audit}`)"))


def _print_replay(out: dict[str, Any], path: str, audit: str) -> None:
    print(terminal_safe(f"{path} (sha256 {out['policy_sha256'][:12]}…) against the recorded calls:"))
    _not_intact(out, audit)
    print(f"  {out['decided']} decided again: {out['unchanged']} unchanged, {out['changed']} changed; "
          f"{out['undecidable']} undecidable; {out['not_decided']} refused before any policy decided")
    if out["bad_lines"]:
        print(f"  {out['bad_lines']} line(s) of the log were not records and were skipped "
              "(run `proctor audit verify`)")
    for title, key in (("by change", "by_change"), ("by rule", "by_rule")):
        if not out[key]:
            continue
        print(f"\n{title}:")
        for name, group in out[key].items():
            print(terminal_safe(f"  {name}: {group['count']}"))
            if key == "by_change":
                for ex in group["examples"]:
                    rules = ",".join(ex["new_rules"] or ex["old_rules"]) or "(default)"
                    print(terminal_safe(f"    seq {ex['seq']} run {ex['run_id']} {ex['tool']}"
                                        f"({json.dumps(ex['args'], ensure_ascii=False)[:120]}) [{rules}]: "
                                        f"{ex['new_reason']}"))
    if out["undecidable"]:
        print(f"\nundecidable: {out['undecidable']} recorded call(s) could not be decided again (the log cannot "
              "answer; never guessed), by reason:")
        for why, group in out["undecidable_by_reason"].items():
            print(terminal_safe(f"  {group['count']}: {why}"))
            for ex in group["examples"]:
                print(terminal_safe(f"    seq {ex['seq']} run {ex['run_id']} {ex['tool']}"))
        print("  (this report says nothing of what the policy would do to them: --fail-on-undecidable fails on them)")


def _coverage(args: argparse.Namespace) -> int:
    from proctor.errors import AuditError
    from proctor.policy.coverage import coverage_log

    got = _inputs(args)
    if isinstance(got, int):
        return got
    policy, since = got
    try:
        report = coverage_log(policy, args.audit, since_ns=since, pubkey=args.pubkey)
    except (OSError, AuditError) as exc:
        return _read_failure(args, exc)
    out = report.as_dict()
    if args.json:
        print(json.dumps(out, ensure_ascii=False, sort_keys=True))
        return 0
    print(terminal_safe(f"{args.policy} (sha256 {out['policy_sha256'][:12]}…) over {out['calls']} recorded call(s) "
                        f"({out['undecidable']} undecidable, left out of the rule counts):"))
    _not_intact(out, args.audit)
    if out["bad_lines"]:
        print(f"  {out['bad_lines']} line(s) of the log were not records and were skipped "
              "(run `proctor audit verify`)")
    sections = (("rules that never matched", out["never_matched"]),
                ("rules that always matched (every call they could apply to)", out["always_matched"]),
                ("budgets never approached (peak use under 50%)", [
                    f"{b['name']}: peak {b['max_fraction']:.0%}" for b in out["budgets"]
                    if b["replayed"] and b["max_fraction"] < 0.5]),
                ("budgets on the model's usage only, not replayed (the steps' usage is in the log)", [
                    b["name"] for b in out["budgets"] if not b["replayed"]]),
                ("tools called but not declared in `tools`", out["undeclared_tools"]))
    for title, items in sections:
        if not items and title.startswith("budgets on the model"):  # (said only where a policy has one)
            continue
        print(f"\n{title}: {len(items)}")
        for item in items:
            print(terminal_safe(f"  {item}"))
    return 0
