"""`proctor policy check | explain | test | schema` (and `replay | coverage`, from `proctor.cli.policy_ops`).

Exit codes: 0 valid / all cases pass; 1 invalid policy, failing case, or malformed
cases file; 2 usage (bad JSON on the command line, unknown option). Heavy imports
happen inside the commands so `proctor --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from proctor.termsafe import terminal_safe

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add `policy` and its subcommands to the `proctor` command."""
    policy = subparsers.add_parser("policy", help="check, explain, test a policy file; replay an audit log under it; "
                                   "print its JSON Schema")
    sub = policy.add_subparsers(dest="policy_command", metavar="SUBCOMMAND")
    policy.set_defaults(func=lambda _args: _usage(policy))

    tools_help = ("the real tools (as `proctor run`): a module of @tool functions, or MOD:ATTR (repeatable); "
                  "arguments and history are then validated and completed with their schema defaults")
    check = sub.add_parser("check", help="validate a policy file (exit 1 listing every problem)")
    check.add_argument("policy", metavar="P")
    check.add_argument("--tools", action="append", default=[], metavar="MOD:ATTR",
                       help="check tool names and `args.x` against the real tools (repeatable)")
    check.set_defaults(func=_check)

    explain = sub.add_parser("explain", help="decide one call as the gate would and show which rules matched and why")
    explain.add_argument("policy", metavar="P")
    explain.add_argument("--tool", required=True)
    explain.add_argument("--args", default="{}", metavar="JSON", help="the call's arguments, a JSON object")
    explain.add_argument("--history", default="[]", metavar="JSON", help="earlier calls: a JSON list")
    explain.add_argument("--run", default="{}", metavar="JSON", help="run info: id, step, principal, labels, agent")
    explain.add_argument("--usage", default="{}", metavar="JSON",
                         help='what budgets have used: {"outbound": {"calls": 4, "cost": 12}}')
    explain.add_argument("--side-effect", dest="side_effect", default=None, help="the tool's declared class")
    explain.add_argument("--task", default=None, metavar="TEXT",
                         help="the run's task: the source 'user' of provenance() and from_user()")
    explain.add_argument("--results", default="[]", metavar="JSON",
                         help="earlier results of labelled tools: a JSON list of {tool, value} or {labels, value}")
    explain.add_argument("--tools", action="append", default=[], metavar="MOD:ATTR", help=tools_help)
    explain.add_argument("--json", action="store_true",
                         help="print only outcome, rules, reason, policy_sha256")
    explain.set_defaults(func=_explain)

    test = sub.add_parser("test", help="run table-driven cases against a policy (exit 1 if any fails)")
    test.add_argument("policy", metavar="P")
    test.add_argument("cases", metavar="CASES.yaml")
    test.add_argument("--tools", action="append", default=[], metavar="MOD:ATTR", help=tools_help)
    test.set_defaults(func=_test)

    schema = sub.add_parser("schema", help="print the JSON Schema of policy files (for yaml-language-server)")
    schema.set_defaults(func=_schema)

    from proctor.cli.policy_ops import register as register_ops  # replay, coverage: a policy against a log

    register_ops(sub)


def _esc(text: object) -> str:
    """Untrusted text for a rich table or markup line: terminal escapes made visible, markup escaped."""
    from rich.markup import escape

    return escape(terminal_safe(text))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _load(path: str) -> Any:
    """The policy at `path`, or None after printing every issue."""
    from proctor.errors import PolicyError
    from proctor.policy import Policy

    try:
        return Policy.from_yaml(path)
    except PolicyError as exc:
        for issue in exc.issues:
            print(terminal_safe(issue))
        return None


def _load_for_check(path: str) -> tuple[Any, Any] | None:
    """The policy at `path` and the positions of its keys and values, or None after printing every issue.

    Validated without importing pydantic (`proctor.policy.fastcheck`: the same checks and messages;
    the policy's parts are plain records): `check` only reads the policy, and starts fast.
    """
    from proctor.errors import PolicyError
    from proctor.policy.engine import Policy
    from proctor.policy.loader import load_policy_marked
    from proctor.policy.yamlsafe import read_yaml_file

    try:
        model, marks = load_policy_marked(read_yaml_file(path, "policy"), path, fast=True)
        return Policy(model, path), marks
    except PolicyError as exc:
        for issue in exc.issues:
            print(terminal_safe(issue))
        return None


_NO_DEFAULTS = ("note: schema defaults were not applied (arguments and history taken as written); "
                "give --tools MOD:ATTR to validate and complete them as the gate does")


def _load_tools(command: str, specs: list[str]) -> dict[str, Any] | None:
    """The tools named by --tools, by name ({} when none given); None after printing why they cannot load."""
    if not specs:
        return {}
    from proctor.agent.loading import load_tools
    from proctor.errors import ProctorError

    try:
        return {t.name: t for t in load_tools(specs)}
    except (ProctorError, ValueError) as exc:
        print(terminal_safe(f"proctor policy {command}: {exc}"), file=sys.stderr)
        return None


def _check(args: argparse.Namespace) -> int:
    from proctor.policy.lint import lint

    tools = _load_tools("check", args.tools)
    if tools is None:
        return 2
    loaded = _load_for_check(args.policy)
    if loaded is None:
        return 1
    policy, marks = loaded
    findings = lint(policy, args.policy, tools or None, marks=marks)  # positions from the text validated
    errors = [f for f in findings if f.severity == "error"]
    for finding in findings:
        print(terminal_safe(finding))
    if errors:
        return 1
    from proctor.policy.budget_trace import describe_budget

    summary = f"{args.policy}: ok ({len(policy.rules)} rules, {len(policy.budgets)} budgets, sha256 {policy.sha256})"
    print(terminal_safe(summary))
    for spec in policy.budgets:
        print(terminal_safe(f"  {describe_budget(spec)}"))
    from proctor.policy.aggregates import window_notes

    for note in window_notes((rule.name, rule.when) for rule in policy.rules):
        print(terminal_safe(f"  note: {note}"))
    if any(spec.shared for spec in policy.budgets) and policy.model.ledger == "local":
        print("  note: `ledger: local`: principal, label and global budgets are counted by each process on its own "
              "(run summaries and the audit log say so)")
    elif any(spec.shared for spec in policy.budgets):
        print("  note: principal, label and global budgets count across runs: a gate refuses to start without a "
              "shared ledger; give every process the same --ledger redis://… (or PROCTOR_LEDGER), or write "
              "`ledger: local` if one process is meant")
    return 0


def _json_arg(name: str, text: str, kind: type) -> Any:
    from proctor.errors import ConfigurationError
    from proctor.jsoninput import loads_bounded

    try:
        value = loads_bounded(text, f"--{name}")  # size and depth bounded: no RecursionError traceback
    except ConfigurationError as exc:
        raise _UsageError(str(exc)) from None
    if not isinstance(value, kind):
        raise _UsageError(f"--{name}: expected a JSON {'object' if kind is dict else 'list'}")
    return value


class _UsageError(Exception):
    pass


def _explain(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from proctor.policy.admission import facts_of
    from proctor.policy.cases import Case
    from proctor.policy.explain import explain
    from proctor.policy.simulate import SimulationError

    try:
        case = Case.model_validate(
            {
                "tool": args.tool,
                "args": _json_arg("args", args.args, dict),
                "history": _json_arg("history", args.history, list),
                "run": _json_arg("run", args.run, dict),
                "usage": _json_arg("usage", args.usage, dict),
                "side_effect": args.side_effect,
                "task": args.task,
                "results": _json_arg("results", args.results, list),
                "expect": "deny",  # unused: explain has no expectation
            }
        )
    except _UsageError as exc:
        print(terminal_safe(f"proctor policy explain: {exc}"), file=sys.stderr)
        return 2
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            where = ".".join(str(p) for p in err["loc"])
            print(terminal_safe(f"proctor policy explain: {where}: {err['msg']}"), file=sys.stderr)
        return 2
    tools = _load_tools("explain", args.tools)
    if tools is None:
        return 2
    policy = _load(args.policy)
    if policy is None:
        return 1
    try:
        call = case.call()
        index = case.sources(policy)
        if index is not None:
            call = replace(call, provenance=index)
        result = explain(policy, call, tools=tools or None, usage=case.usage)
    except SimulationError as exc:
        print(terminal_safe(f"proctor policy explain: {exc}"), file=sys.stderr)
        return 2
    decision = result.decision
    if args.json:
        shown = decision.as_dict()  # the Decision (DESIGN §4); a budget refusal names no rule, and the budget
        if result.budget:
            shown["budget"] = result.budget
        print(json.dumps(shown))
        return 0
    print(terminal_safe(f"outcome:  {decision.outcome}"))
    if result.budget:
        print(terminal_safe(f"budget:   {result.budget} (refused before any human is asked)"))
        ruled = result.rules_decision
        overruled = (f" (the budget decided; the rules alone gave {ruled.outcome}"
                     + (f": {', '.join(ruled.rules)}" if ruled.rules else "") + ")") if ruled is not None else ""
        print(terminal_safe(f"rules:    (none){overruled}"))
    else:
        print(terminal_safe(f"rules:    {', '.join(decision.rules) or '(none)'}"))
    print(terminal_safe(f"reason:   {decision.reason}"))
    for note in result.windows:
        print(terminal_safe(f"history:  {note}"))
    labels = facts_of(policy, args.tool).labels if args.tool in policy.model.tools else ()
    print(terminal_safe(f"tool:     {args.tool} (side_effect {result.side_effect}"
                        + (f"; labels {', '.join(labels)}" if labels else "") + ")"))
    print(terminal_safe(f"policy:   {args.policy} sha256 {decision.policy_sha256}"))
    if result.args is not None:
        print(terminal_safe(f"args:     {json.dumps(result.args, default=str)} (validated, schema defaults applied)"))
    else:
        print(_NO_DEFAULTS)
    for line in result.sources:
        print(terminal_safe(f"sources:  {line}"))
    print("considered:")
    for trace in result.rules:
        mark = "✔" if trace.matched else "·"
        print(terminal_safe(f"  {mark} {trace.name} [{trace.decision}] {trace.note}"))
    if not result.rules:
        print("  (the policy has no rules)")
    from proctor.policy.budget_trace import trace_budgets

    traces = trace_budgets(policy, case.call())
    if traces:
        print("budgets:")
    for t in traces:
        if not t.counted:
            print(terminal_safe(f"  · {t.name} does not count this call"))
            continue
        mark = "✘" if t.refusal else "✔"
        pool = f" [pool {t.pool}]" if t.pool else ""
        print(terminal_safe(f"  {mark} {t.name} counts it, {t.scope}{pool}"
                            + (f": would refuse, {t.refusal}" if t.refusal else "")))
    return 0


def _test(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from proctor.errors import PolicyError
    from proctor.policy.cases import load_cases, run_cases
    from proctor.policy.yamlsafe import read_yaml_file

    tools = _load_tools("test", args.tools)
    if tools is None:
        return 2
    policy = _load(args.policy)
    if policy is None:
        return 1
    try:
        cases = load_cases(read_yaml_file(args.cases, "cases file"), args.cases, policy, tools or None)
        results = run_cases(policy, cases, tools or None, args.cases)
    except PolicyError as exc:
        for issue in exc.issues:
            print(terminal_safe(issue))
        return 1
    table = Table(title=_esc(f"policy {args.policy}, cases {args.cases}"), title_justify="left")
    for column in ("#", "case", "tool", "expected", "got", "result"):
        table.add_column(column, no_wrap=column in ("#", "result"))
    for r in results:
        shown = r.case.rules is not None
        expected = r.case.expect + (f" [{', '.join(sorted(r.case.rules or ()))}]" if shown else "")
        got = r.decision.outcome + (f" [{', '.join(sorted(r.decision.rules))}]" if shown else "")
        if r.case.budget is not None or r.budget is not None:
            expected += f" budget {r.case.budget}" if r.case.budget else ""
            got += f" budget {r.budget}" if r.budget else ""
        if r.case.budgets is not None:
            expected += f" counted by [{', '.join(sorted(r.case.budgets))}]"
            got += f" counted by [{', '.join(sorted(r.counted_by))}]"
        verdict = "[green]PASS[/]" if r.passed else "[bold red]FAIL[/]"
        table.add_row(str(r.index + 1), _esc(r.label), _esc(r.case.tool), _esc(expected), _esc(got), verdict)
    console = Console(highlight=False, width=max(100, Console().width))
    console.print(table)
    failed = [r for r in results if not r.passed]
    for r in failed:
        console.print(f"[red]FAIL[/] {_esc(r.label)}: {_esc(r.decision.reason)}")
    if not tools:
        console.print(_esc(_NO_DEFAULTS))
    console.print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def _schema(_args: argparse.Namespace) -> int:
    from proctor.policy.schema import policy_json_schema

    print(json.dumps(policy_json_schema(), indent=2, sort_keys=True))
    return 0
