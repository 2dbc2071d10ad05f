"""`policy check` reads the condition language closely: regexes, function calls, '=', the argument's kind;
`explain` names the budget that denied and the windows a policy writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proctor.calls import Call
from proctor.cli import main
from proctor.policy import Policy
from proctor.policy.conditions import ConditionError, compile_condition, regex_problem
from proctor.policy.lint import argument_kind, lint


def _policy(tmp_path: Path, when: str, name: str = "r") -> Path:
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\ntools:\n  t: {side_effect: write}\nrules:\n"
                    f"  - name: {name}\n    match: {{tool: t}}\n    when: {json.dumps(when)}\n    decision: allow\n")
    return path


def test_an_invalid_regex_fails_check_located_with_the_engines_reason(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """matches('[abc') is refused at check, at the pattern's line and column, saying what is wrong in it."""
    path = _policy(tmp_path, "args.id.matches('[abc')")
    assert main(["policy", "check", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}:7:28: rule 'r': when: matches(): '[abc' is not a valid regular expression: " \
           "unclosed character class, at character 1 of the pattern" in out


@pytest.mark.parametrize(("when", "reason"), [
    ("args.id.matches('a{2,1}')", "invalid repetition count range"),
    ("matches(args.id, '(?=x)y')", "look-around"),
    ("args.id.matches(r'(a)\\1')", "backreferences are not supported"),
    ("args.id.matches('\\\\')", "incomplete escape"),
    ("args.xs.exists(x, x.matches('(unclosed'))", "unclosed group"),
    ("history.exists(h, h.tool.matches('[z-a]'))", "invalid character class range"),
])
def test_every_literal_pattern_is_checked(when: str, reason: str) -> None:
    """Method or function form, inside macros and history pipelines: the engine's reason, never an empty one."""
    with pytest.raises(ConditionError, match=reason) as caught:
        compile_condition(when)
    assert caught.value.column > 1 and "matches()" in caught.value.message


def test_valid_patterns_and_patterns_built_at_run_time() -> None:
    """Valid patterns load; a pattern from the arguments is checked when it runs, and the deny says why."""
    for ok in ("args.id.matches(r'^\\d+$')", "args.id.matches('^\\\\d+$')", "args.id.matches('(?i)^ab$')"):
        compile_condition(ok)
    assert regex_problem("^[a-z]+$") is None
    problem = regex_problem("[abc")
    assert problem is not None and problem[0] == "unclosed character class"
    policy = Policy.from_dict({"version": 1, "default": "allow", "rules": [
        {"name": "r", "when": "args.text.matches(args.pattern)", "decision": "allow"}]})
    decision = policy.decide(Call("t", {"text": "x", "pattern": "[abc"}))
    assert decision.outcome == "deny"
    assert decision.reason.endswith("is not a valid regular expression: unclosed character class")


@pytest.mark.parametrize(("when", "message", "column"), [
    ("path_within(args.path)", "path_within() takes 2 arguments, got 1", 1),
    ("args.to.startsWith()", "startsWith() takes 2 arguments, got 1 (counting the value before the dot)", 9),
    ("normalize(args.to, 'x') == 'a'", "normalize() takes 1 argument, got 2", 1),
    ("size(args.a, args.b) > 1", "size() takes 1 argument, got 2", 1),
    ("args.s.split() == []", "split() takes 2 to 3 arguments, got 1", 8),
    ("from_user(args.a, args.b)", "from_user() takes 1 argument, got 2", 1),
    ("args.a.lowerAscii(1) == 'a'", "lowerAscii() takes 1 argument, got 2", 8),
])
def test_function_arity_is_checked(when: str, message: str, column: int) -> None:
    """A call with too few or too many arguments is a located load error naming the function's arity."""
    with pytest.raises(ConditionError) as caught:
        compile_condition(when)
    assert message in caught.value.message and caught.value.column == column


def test_unknown_functions_are_still_refused() -> None:
    """An unknown function names the closest known one."""
    with pytest.raises(ConditionError, match=r"unknown function 'path_withn' \(did you mean 'path_within'"):
        compile_condition("path_withn(args.p, '/srv')")


@pytest.mark.parametrize(("when", "column"), [("args.env = 'prod'", 10), ("tool == 'a=b' && args.n = 1", 25),
                                              ("args.a=1", 7)])
def test_a_single_equals_says_did_you_mean(when: str, column: int) -> None:
    """'=' as a comparison: did you mean '=='? at the '='; an '=' inside a string is not it."""
    with pytest.raises(ConditionError, match="did you mean '=='") as caught:
        compile_condition(when)
    assert caught.value.column == column


def test_check_prints_did_you_mean_located(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Through policy check: file:line:col: … did you mean '=='?"""
    path = _policy(tmp_path, "args.env = 'prod'")
    assert main(["policy", "check", str(path)]) == 1
    assert f"{path}:7:21: rule 'r': when: '=' is not a CEL operator: did you mean '=='?" in capsys.readouterr().out


@pytest.mark.parametrize(("name", "literal", "kind"), [
    ("args.path", "/srv/", "path"), ("args.dest_dir", None, "path"), ("args.x", "/etc", "path"),
    ("args.to", None, "address"), ("args.too", "@x.com", "address"), ("args.cmd", None, "command"),
    ("args.sql", None, "command"), ("args.url", None, "url"), ("args.target_host", None, "url"),
    ("args.x", "https://a", "url"), ("args.amount", None, "amount"), ("args.name", "bob", "text"),
])
def test_argument_kinds(name: str, literal: str | None, kind: str) -> None:
    """The lint's idea of what an argument holds: by name, else by the literal it is compared with."""
    assert argument_kind(name, literal) == kind


@pytest.mark.parametrize(("when", "says", "never"), [
    ("args.path.startsWith('/srv/out/')", "write path_within(args.path, '/srv/out')", "e-mail"),
    ("args.path.startsWith('/srv/out')", "'/srv/outside'", "@X.COM"),
    ("args.paths.exists(p, p.startsWith('/srv/out/'))", "path_within(p, '/srv/out')", "@X.COM"),
    ("args.file == '/etc/passwd'", "path_normalize(args.file)", "@X.COM"),
    ("args.cmd.startsWith('ls ')", "normalize(args.cmd).matches(", "@X.COM"),
    ("args.url.startsWith('https://ok.example/')", "'HTTPS://Host.example'", "@X.COM"),
    ("args.amount == '100'", "compared as a string", "@X.COM"),
    ("args.to.endsWith('@x.com')", "email_domain()", "path_within"),
    ("args.name == 'bob'", "normalize(args.name)", "@X.COM"),
])
def test_lint_speaks_of_the_arguments_kind(when: str, says: str, never: str) -> None:
    """The unnormalised-comparison warning names what gets past it for this kind of argument."""
    policy = Policy.from_dict({"version": 1, "rules": [{"name": "r", "when": when, "decision": "allow"}]})
    (finding,) = lint(policy)
    assert finding.severity == "warning"
    assert says in finding.issue.message and never not in finding.issue.message


def test_no_warning_for_confined_paths() -> None:
    """path_within and path_normalize comparisons are what the warning asks for."""
    policy = Policy.from_dict({"version": 1, "rules": [
        {"name": "r", "when": "path_within(args.path, '/srv/out') && path_normalize(args.src) != '/etc/passwd'",
         "decision": "allow"}]})
    assert lint(policy) == []


BUDGETED = """\
version: 1
tools:
  page_oncall: {side_effect: external}
budgets:
  - name: pages
    match: {tool: page_oncall}
    limit: {calls: 3}
rules:
  - name: allow-pages
    match: {tool: page_oncall}
    decision: allow
"""


def test_explain_names_the_budget_not_the_allow_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A budget denial: the budget decided; the rule that allowed is shown as overruled, never as the decider."""
    path = tmp_path / "p.yaml"
    path.write_text(BUDGETED)
    assert main(["policy", "explain", str(path), "--tool", "page_oncall", "--usage", '{"pages": {"calls": 3}}']) == 0
    out = capsys.readouterr().out
    assert "outcome:  deny" in out and "budget:   pages (refused before any human is asked)" in out
    assert "rules:    (none) (the budget decided; the rules alone gave allow: allow-pages)" in out
    assert main(["policy", "explain", str(path), "--tool", "page_oncall", "--usage", '{"pages": {"calls": 3}}',
                 "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["outcome"] == "deny" and shown["rules"] == [] and shown["budget"] == "pages"
    assert "budget 'pages'" in shown["reason"]
    assert main(["policy", "explain", str(path), "--tool", "page_oncall", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["rules"] == ["allow-pages"] and "budget" not in shown


def test_check_and_explain_state_the_windows_a_policy_writes(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """history.last(N) is the only window, and both commands say which rule reads one; none otherwise."""
    path = _policy(tmp_path, "history.last(100).exists(h, h.args.to == args.to)", name="recent")
    assert main(["policy", "check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "note: rule 'recent' reads the last 100 calls of the run (history.last(N), a window it writes)" in out
    assert main(["policy", "explain", str(path), "--tool", "t", "--args", '{"to": "a"}']) == 0
    assert "history:  rule 'recent' reads the last 100 calls of the run" in capsys.readouterr().out
    path = _policy(tmp_path, "history.exists(h, h.args.to == args.to)", name="ever")
    assert main(["policy", "check", str(path)]) == 0
    assert "last" not in capsys.readouterr().out
    # A window whose size the call gives is a window too, and said so.
    path = _policy(tmp_path, "history.last(args.n).exists(h, h.args.to == args.to)", name="sized")
    assert main(["policy", "check", str(path)]) == 0
    assert "rule 'sized' reads a number of last calls the call itself gives" in capsys.readouterr().out
