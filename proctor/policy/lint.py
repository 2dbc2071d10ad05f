"""`proctor policy check`'s second pass: mistakes a valid policy can still hold.

The loader refuses what cannot mean anything; this pass finds what probably does not
mean what ops intended, each located in the file:

- a rule or budget matching a tool name the `tools:` section does not declare but
  is close to one it does (``send_mail`` for ``send_email``): a warning; with the real
  tools (``--tools``), a name or glob matching no tool is an error;
- ``usage['x']`` / ``usage.x`` naming a budget that does not exist: an error (the
  condition would fail on every call);
- with the real tools, ``args.x`` in a condition where no tool the rule matches has a
  parameter ``x``: an error;
- a string comparison on an argument (``args.to.endsWith('@x.com')``, ``== 'x'``,
  ``in ['a']``, also on the elements of ``args.xs.exists(c, …)``) that is not
  normalised: a warning naming what gets past it for the argument's kind — an address
  (``@X.COM``, a trailing dot: `email_domain()`), a path (``/srv/out/../private``: a
  ``startsWith`` on a path points to `path_within()`), a command, a URL, an amount
  compared as a string, anything else (`normalize()`).
- ``same_record(a, b, 'TOOL')`` / ``same_call(…)`` whose tools (a name or a list of names, written literally)
  include one that is not a tool with `sources:` in the policy: an error (only those results have records, so
  the condition could never hold for it).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from proctor.errors import PolicyIssue
from proctor.policy.admission import facts_of
from proctor.policy.loader import Marks, _cel_position, compose_marked
from proctor.policy.matching import Matcher, is_glob
from proctor.policy.yamlsafe import read_yaml_file

if TYPE_CHECKING:
    from proctor.policy.engine import Policy
    from proctor.tools import Tool

__all__ = ["Finding", "lint", "lint_policy"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One finding: an `error` (check exits 1) or a `warning`, located like a load error."""

    severity: Literal["error", "warning"]
    issue: PolicyIssue

    def __str__(self) -> str:
        i = self.issue
        prefix = "warning: " if self.severity == "warning" else ""
        return f"{i.file}:{i.line}:{i.column}: {prefix}{i.message}"


_USAGE = re.compile(r"(?<![\w.])usage\s*(?:\.\s*([A-Za-z_]\w*)|\[\s*(?:'([^'\\]*)'|\"([^\"\\]*)\")\s*\])")
_ARG = re.compile(r"(?<![\w.])args\s*(?:\.\s*([A-Za-z_]\w*)|\[\s*(?:'([^'\\]*)'|\"([^\"\\]*)\")\s*\])")
_STRING_TEST = r"(?:\s*\.\s*(?:endsWith|startsWith|contains)\s*\(\s*['\"]|\s*[!=]=\s*['\"]|\s+in\s+\[\s*['\"])"
_ARG_PATH = r"args(?:\s*\.\s*[A-Za-z_]\w*(?!\s*\()|\s*\[\s*'[^']*'\s*\])+"
_ARG_COMPARED = re.compile(r"(?<![\w.])" + _ARG_PATH + "(?=" + _STRING_TEST + ")")
_ARG_MACRO = re.compile(
    r"(?<![\w.])(" + _ARG_PATH + r")\s*\.\s*(?:exists|all|exists_one|filter|map)\s*\(\s*([A-Za-z_]\w*)\s*,"
)
_NORMALISING = re.compile(r"(?:normalize|email_domain|path_normalize|lowerAscii|upperAscii)\s*\(\s*$")
_TEST_AT = re.compile(r"\s*(?:\.\s*(endsWith|startsWith|contains)\s*\(|([!=]=)|(in)\s*\[)\s*"
                      r"(?:'([^'\\]*)'|\"([^\"\\]*)\")?")

#: The kinds of argument the warning speaks of, recognised by the argument's name (its last part).
_KIND_NAMES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("path", re.compile(r"(?:^|_)(?:path|paths|file|files|filename|filepath|dir|dirs|directory|folder|dest|"
                        r"destination|target|location|root|cwd|workdir|src|output)$")),
    ("address", re.compile(r"(?:^|_)(?:to|cc|bcc|email|emails|mail|from|recipient|recipients|sender|reply_to|"
                           r"address|addresses)$")),
    ("url", re.compile(r"(?:^|_)(?:url|urls|uri|link|endpoint|href|host|hostname|domain|site|origin|webhook)$")),
    ("command", re.compile(r"(?:^|_)(?:cmd|command|commands|shell|script|sql|query|code|program|argv|line)$")),
    ("amount", re.compile(r"(?:^|_)(?:amount|price|total|sum|cost|quantity|qty|count|limit|fee)$")),
)


def lint_policy(path: str, tools: Mapping[str, Tool] | None = None) -> list[Finding]:
    """Load the policy at `path` and lint it (raises PolicyError when it does not load)."""
    from proctor.policy.engine import Policy

    return lint(Policy.from_yaml(path), path, tools)


def lint(policy: Policy, path: str | None = None, tools: Mapping[str, Tool] | None = None, *,
         marks: Marks | None = None) -> list[Finding]:
    """Every finding for `policy` (loaded from `path`), sorted by position.

    Positions come from `marks` (`load_policy_marked` gives them), else from reading `path` again.
    """
    if marks is None:
        marks = compose_marked(read_yaml_file(path, "policy"), path)[1] if path else Marks()
    source = path or policy.source
    findings: list[Finding] = []

    def at(loc: tuple[Any, ...], offset: int | None = None) -> tuple[int, int]:
        if offset is not None and loc in marks.nodes:
            text = str(marks.nodes[loc].value)
            line = text.count("\n", 0, offset) + 1
            column = offset - (text.rfind("\n", 0, offset) + 1) + 1
            return _cel_position(marks, loc, line, column)
        return marks.value_at(loc) if marks.values else (0, 0)

    def add(severity: Literal["error", "warning"], loc: tuple[Any, ...], message: str,
            offset: int | None = None) -> None:
        findings.append(Finding(severity, PolicyIssue(source, *at(loc, offset), message)))

    declared = sorted(policy.model.tools)
    real = sorted(tools) if tools is not None else None
    budgets = [b.name for b in policy.budgets]
    sections: tuple[tuple[str, str, tuple[Any, ...]], ...] = (
        ("rules", "rule", policy.rules), ("budgets", "budget", policy.budgets))
    for section, noun, items in sections:
        for i, item in enumerate(items):
            names = item.match.tool if item.match is not None and item.match.tool else ()
            for j, name in enumerate(names):
                loc: tuple[Any, ...] = (section, i, "match", "tool")
                if _is_list(marks, section, i):
                    loc = (*loc, j)
                _check_tool_name(add, loc, f"{noun} '{item.name}'", name, declared, real)
    for i, rule in enumerate(policy.rules):
        if rule.when is None:
            continue
        loc = ("rules", i, "when")
        who = f"rule '{rule.name}'"
        for offset, budget in _usage_names(rule.when):
            if budget not in budgets:
                close = difflib.get_close_matches(budget, budgets, n=1)
                hint = f"did you mean '{close[0]}'?" if close else f"budgets: {', '.join(budgets) or 'none'}"
                add("error", loc, f"{who}: when: usage['{budget}'] names no budget ({hint})", offset)
        if tools is not None:
            params = _parameters(policy, rule, tools)
            if params is not None:
                for offset, arg in _arg_names(rule.when):
                    if arg not in params:
                        close = difflib.get_close_matches(arg, sorted(params), n=1)
                        hint = (f"did you mean '{close[0]}'?" if close
                                else f"parameters: {', '.join(sorted(params))}")
                        add("error", loc, f"{who}: when: args.{arg}: no tool this rule matches has a parameter "
                                          f"'{arg}' ({hint})", offset)
        for offset, what in unnormalised_comparisons(rule.when):
            add("warning", loc, f"{who}: when: {_unnormalised_message(rule.when, offset, what)}", offset)
    with_sources = sorted(name for name, spec in policy.model.tools.items() if spec.sources is not None)
    written: list[tuple[tuple[Any, ...], str, str]] = [
        (("rules", i, "when"), f"rule '{rule.name}'", rule.when) for i, rule in enumerate(policy.rules)
        if rule.when is not None]
    written += [(("let", name), f"let '{name}'", text) for name, text in policy.model.let.items()]
    for loc, who, text in written:
        for offset, function, name in record_tool_names(text):
            if name not in with_sources:
                close = difflib.get_close_matches(name, with_sources, n=1)
                hint = (f"did you mean '{close[0]}'?" if close
                        else f"tools with sources: {', '.join(with_sources) or 'none'}")
                add("error", loc, f"{who}: {function}(…, '{name}'): no tool with sources: is named '{name}', so "
                                  f"it has no records and this never holds ({hint})", offset)
    if tools is not None:  # `sources.fields` paths against the tools' declared result types
        from proctor.policy.dataflow import source_findings

        for loc, message in source_findings(policy, tools):
            add("error", loc, message)
    findings.sort(key=lambda f: (f.issue.line, f.issue.column))
    return findings


_RECORD_CALL = re.compile(r"(?<![\w.])(same_record|same_call)\s*\(")
_STRING_LITERAL = re.compile(r"'([^'\\]*)'|\"([^\"\\]*)\"")


def record_tool_names(source: str) -> Iterator[tuple[int, str, str]]:
    """(offset, function, tool name) of each tool named literally as the third argument of `same_record` or
    `same_call` in `source` (``'t'`` or ``['t', 'u']``); other forms are not looked at."""
    for found in _RECORD_CALL.finditer(source):
        depth, quote, commas, i = 0, "", [], found.end()
        while i < len(source):
            c = source[i]
            if quote:
                if c == "\\":
                    i += 1
                elif c == quote:
                    quote = ""
            elif c in "'\"":
                quote = c
            elif c in "([{":
                depth += 1
            elif c in ")]}":
                if depth == 0:
                    break
                depth -= 1
            elif c == "," and depth == 0:
                commas.append(i)
            i += 1
        if len(commas) != 2:
            continue
        third = source[commas[1] + 1 : i]
        body = third.strip()
        if body.startswith("[") and body.endswith("]"):
            body = body[1:-1]
        pieces = [p.strip() for p in body.split(",")] if body.strip() else []
        if not pieces or not all(_STRING_LITERAL.fullmatch(p) for p in pieces):
            continue
        start = commas[1] + 1
        for literal in _STRING_LITERAL.finditer(third):
            yield start + literal.start(), found.group(1), literal.group(1) or literal.group(2) or ""


def argument_kind(name: str, literal: str | None = None) -> str:
    """What an argument holds, by its name and the literal it is compared with: path, address, url,
    command, amount, or text."""
    last = name.rsplit(".", 1)[-1].strip("[]'\"").lower()
    for kind, pattern in _KIND_NAMES:
        if pattern.search(last):
            return kind
    if literal:
        if literal.startswith(("/", "./", "../", "~/")):
            return "path"
        if re.match(r"[a-z][a-z0-9+.-]*://", literal, re.IGNORECASE):
            return "url"
        if "@" in literal:
            return "address"
    return "text"


def _unnormalised_message(source: str, offset: int, what: str) -> str:
    """The warning for `what` (an argument, or a macro's bound name) compared as written at `offset`."""
    test = _TEST_AT.match(source, offset + len(what)) or _TEST_AT.search(source, offset)
    method = test.group(1) if test else None
    literal = next((g for g in (test.group(4), test.group(5)) if g is not None), None) if test else None
    name = what
    if not what.startswith("args"):  # a macro's bound name: the kind of the list it ranges over
        listed = re.search(rf"(args(?:\s*\.\s*[A-Za-z_]\w*)+)\s*\.\s*\w+\s*\(\s*{re.escape(what)}\s*,", source)
        name = re.sub(r"\s+", "", listed.group(1)) if listed else what
    kind = argument_kind(name, literal)
    head = f"{what} is compared as written, so "
    if kind == "path":
        if method == "startsWith":
            root = (literal or "/srv/out").rstrip("/") or "/"
            sibling = "" if (literal or "").endswith("/") else f", '{root}side'"
            return (head + f"'{root}/../private'{sibling} and '{root}/./../x' get past it (paths are "
                    f"not strings): write path_within({what}, '{root}'), which normalises '.', '..' and "
                    "repeated or trailing '/' first")
        return (head + "'./x', 'a/../x', '//x' or a trailing '/' get past it: compare path_normalize("
                f"{what}), or confine it with path_within({what}, '/root')")
    if kind == "address":
        return (head + "'@X.COM', a trailing dot or an invisible character get past it: compare "
                f"normalize({what}) (or email_domain()) with a lower-case literal")
    if kind == "url":
        return (head + "'HTTPS://Host.example', a trailing dot or an invisible character get past it: compare "
                f"normalize({what}) with a lower-case literal (or match it: normalize({what}).matches('^https://"
                "host\\.example(/|$)'))")
    if kind == "command":
        return (head + "other letter case, a tab, doubled spaces or an invisible character get past it: compare "
                f"normalize({what}), or match a pattern (normalize({what}).matches('^ls( |$)'))")
    if kind == "amount":
        return (f"{what} is compared as a string, so '100.0', ' 100' or '1e2' get past it: compare it as a "
                f"number (double({what}) > 100.0)")
    return (head + "other letter case, surrounding spaces or an invisible character get past it: compare "
            f"normalize({what}) with a lower-case literal")


def _is_list(marks: Marks, section: str, i: int) -> bool:
    return (section, i, "match", "tool", 0) in marks.values


def _check_tool_name(add: Any, loc: tuple[Any, ...], who: str, name: str, declared: list[str],
                     real: list[str] | None) -> None:
    if real is not None:
        if is_glob(name):
            if not any(Matcher(frozenset(), (name,), None).tool_matches(t) for t in real):
                add("error", loc, f"{who}: match.tool '{name}' matches none of the tools ({', '.join(real)})")
        elif name not in real:
            close = difflib.get_close_matches(name, real, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"tools: {', '.join(real)}"
            add("error", loc, f"{who}: match.tool '{name}' is not one of the tools ({hint})")
        return
    if is_glob(name) or name in declared:
        return
    close = difflib.get_close_matches(name, declared, n=1)
    if close:
        add("warning", loc, f"{who}: match.tool '{name}' is not declared under tools: (did you mean '{close[0]}'?)")


def _usage_names(source: str) -> Iterator[tuple[int, str]]:
    for found in _USAGE.finditer(source):
        yield found.start(), next(g for g in found.groups() if g is not None)


def _arg_names(source: str) -> Iterator[tuple[int, str]]:
    for found in _ARG.finditer(source):
        yield found.start(), next(g for g in found.groups() if g is not None)


def _parameters(policy: Policy, rule: Any, tools: Mapping[str, Tool]) -> set[str] | None:
    """Parameter names of the tools `rule` can match (None when it matches none: reported elsewhere)."""
    matcher = Matcher.from_spec(rule.match)
    params: set[str] = set()
    matched = False
    for tool in tools.values():
        side_effect = facts_of(policy, tool.name, tool.side_effect, tool.cost).side_effect
        if matcher.matches(tool.name, side_effect):
            matched = True
            params.update(tool.signature.parameters)
    return params if matched else None


def unnormalised_comparisons(source: str) -> list[tuple[int, str]]:
    """(offset, expression) of each argument compared with a string literal without normalising it first."""
    found: list[tuple[int, str]] = []
    for match in _ARG_COMPARED.finditer(source):
        if not _NORMALISING.search(source, 0, match.start()):
            found.append((match.start(), re.sub(r"\s+", "", match.group(0))))
    for macro in _ARG_MACRO.finditer(source):
        bound = macro.group(2)
        body_start = macro.end()
        pattern = re.compile(rf"(?<![\w.]){re.escape(bound)}(?={_STRING_TEST})")
        for use in pattern.finditer(source, body_start):
            if not _NORMALISING.search(source, 0, use.start()):
                found.append((use.start(), bound))
    return sorted(set(found))
