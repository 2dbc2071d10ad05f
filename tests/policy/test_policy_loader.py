"""A corpus of broken policies: each must be refused with the right line, column and message."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from proctor.errors import PolicyError
from proctor.policy import Policy
from proctor.policy.loader import load_policy_text

GOOD_RULE = "  - {name: ok, decision: allow}\n"

# (id, policy text, line, column, exact message)
CORPUS: list[tuple[str, str, int, int, str]] = [
    (
        "yaml-syntax-unclosed-flow",
        "version: 1\nrules: [\n",
        3, 1,
        "YAML syntax error: expected the node content, but found '<stream end>' while parsing a flow node",
    ),
    (
        "yaml-syntax-bad-indent",
        "version: 1\nrules:\n  - name: a\n   decision: allow\n",
        4, 4,
        "YAML syntax error: expected <block end>, but found '<block mapping start>' while parsing a block collection",
    ),
    (
        "yaml-tab-indent",
        "version: 1\nrules:\n\t- name: a\n",
        3, 1,
        "YAML syntax error: found character '\\t' that cannot start any token while scanning for the next token "
        "(indent with spaces, not tabs)",
    ),
    ("not-a-mapping", "- version: 1\n", 1, 1, "a policy is a mapping (version, default, tools, budgets, rules)"),
    ("empty-file", "# nothing here\n", 1, 1, "empty policy: a policy starts with `version: 1`"),
    ("missing-version", "default: deny\n", 1, 1, "missing key 'version' (write `version: 1`)"),
    ("version-2", "version: 2\n", 1, 10, "unsupported version 2 (this proctor reads version 1)"),
    ("version-string", "version: '1'\n", 1, 10, "unsupported version '1' (this proctor reads version 1)"),
    ("unknown-top-level-key", "version: 1\nrule:\n" + GOOD_RULE, 2, 1, "unknown key 'rule' (did you mean 'rules'?)"),
    ("bad-default", "version: 1\ndefault: allw\n", 2, 10,
     "unknown default 'allw' (expected one of allow, deny, require_approval)"),
    ("duplicate-yaml-key", "version: 1\ndefault: deny\ndefault: allow\n", 3, 1,
     "duplicate key 'default' (first at line 2)"),
    (
        "unknown-key-in-rule",
        "version: 1\nrules:\n  - name: r\n    decison: allow\n    decision: allow\n",
        4, 5,
        "rule 'r': unknown key 'decison' (did you mean 'decision'?)",
    ),
    ("missing-rule-name", "version: 1\nrules:\n  - decision: allow\n", 3, 5, "rule #1: missing key 'name'"),
    ("missing-budget-limit", "version: 1\nbudgets:\n  - name: b\n", 3, 5, "budget 'b': missing key 'limit'"),
    ("missing-decision", "version: 1\nrules:\n  - name: r\n", 3, 5, "rule 'r': missing key 'decision'"),
    (
        "bad-decision",
        "version: 1\nrules:\n  - name: r\n    decision: permit\n",
        4, 15,
        "rule 'r': unknown decision 'permit' (expected one of allow, deny, require_approval)",
    ),
    (
        "unknown-side-effect-in-rule",
        "version: 1\nrules:\n  - name: external-mail\n    match: {side_effect: [read, extrnal]}\n"
        "    decision: deny\n",
        4, 33,
        "rule 'external-mail': unknown side_effect 'extrnal' "
        "(expected one of none, read, write, external, destructive)",
    ),
    (
        "unknown-side-effect-in-tools",
        "version: 1\ntools:\n  send_email: {side_effect: externl}\n",
        3, 29,
        "tool 'send_email': unknown side_effect 'externl' (expected one of none, read, write, external, destructive)",
    ),
    ("empty-match", "version: 1\nrules:\n  - name: r\n    match: {}\n    decision: allow\n", 4, 12,
     "rule 'r': empty match: give tool and/or side_effect, or leave out match to match every call"),
    ("unknown-key-in-match", "version: 1\nrules:\n  - name: r\n    match: {tools: x}\n    decision: allow\n", 4, 13,
     "rule 'r': unknown key 'tools' (did you mean 'tool'?)"),
    ("match-tool-wrong-type", "version: 1\nrules:\n  - name: r\n    match: {tool: 3}\n    decision: allow\n", 4, 19,
     "rule 'r': match.tool: tool must be a name or glob, got 3"),
    (
        "cel-syntax",
        "version: 1\nrules:\n  - name: r\n    when: \"args.to.endsWith(\"\n    decision: allow\n",
        4, 29,
        "rule 'r': when: CEL syntax error: mismatched input '<EOF>'",
    ),
    (
        "cel-syntax-in-block",
        "version: 1\nrules:\n  - name: r\n    when: |\n      args.a == 1 &&\n        && true\n    decision: allow\n",
        6, 9,
        "rule 'r': when: CEL syntax error: extraneous input '&&'",
    ),
    (
        "cel-unknown-variable",
        "version: 1\nrules:\n  - name: r\n    when: arg.to == 'x'\n    decision: allow\n",
        4, 11,
        "rule 'r': when: unknown variable 'arg' (did you mean 'args'? "
        "variables: tool, args, side_effect, history, run, usage, seen)",
    ),
    (
        "cel-unknown-function",
        "version: 1\nrules:\n  - name: r\n    when: args.to.endWith('x')\n    decision: allow\n",
        4, 19,
        "rule 'r': when: unknown function 'endWith' (did you mean 'endsWith'?)",
    ),
    ("cel-empty", "version: 1\nrules:\n  - name: r\n    when: ''\n    decision: allow\n", 4, 11,
     "rule 'r': when: empty condition (leave out `when` to match always)"),
    (
        "duplicate-rule-name",
        "version: 1\nrules:\n  - name: r\n    decision: allow\n  - name: r\n    decision: deny\n",
        5, 11,
        "rule 'r': duplicate rule name (first at line 3)",
    ),
    (
        "duplicate-budget-name",
        "version: 1\nbudgets:\n  - {name: b, limit: {calls: 1}}\n  - {name: b, limit: {calls: 2}}\n",
        4, 12,
        "budget 'b': duplicate budget name (first at line 3)",
    ),
    ("negative-calls", "version: 1\nbudgets:\n  - name: b\n    limit: {calls: -1}\n", 4, 20,
     "budget 'b': limit.calls must not be negative, got -1"),
    ("negative-cost", "version: 1\nbudgets:\n  - name: b\n    limit: {cost: -0.5}\n", 4, 19,
     "budget 'b': limit.cost must not be negative, got -0.5"),
    ("negative-tool-cost", "version: 1\ntools:\n  t: {cost: -3}\n", 3, 13,
     "tool 't': cost must not be negative, got -3"),
    ("calls-as-string", "version: 1\nbudgets:\n  - name: b\n    limit: {calls: ten}\n", 4, 20,
     "budget 'b': limit.calls: should be a valid integer, got 'ten'"),
    ("bad-duration-unit", "version: 1\nbudgets:\n  - name: b\n    limit: {wall_time: 5 minutes}\n", 4, 24,
     "budget 'b': limit.wall_time: bad duration '5 minutes' (write a number and a unit: 250ms, 120s, 5m, 1h30m)"),
    ("bare-number-duration", "version: 1\napproval: {timeout: 30}\n", 2, 21,
     "approval: timeout: bad duration 30 (write a number and a unit: 250ms, 120s, 5m, 1h30m)"),
    ("bad-tool-timeout", "version: 1\ntools:\n  t: {timeout: 1d}\n", 3, 16,
     "tool 't': timeout: bad duration '1d' (write a number and a unit: 250ms, 120s, 5m, 1h30m)"),
    ("empty-limit", "version: 1\nbudgets:\n  - name: b\n    limit: {}\n", 4, 12,
     "budget 'b': empty limit: set calls, cost, wall_time, model_tokens or model_cost_usd"),
    ("unknown-key-in-budget",
     "version: 1\nbudgets:\n  - name: b\n    limit: {calls: 1}\n    limits: {calls: 1}\n", 5, 5,
     "budget 'b': unknown key 'limits' (did you mean 'limit'?)"),
    ("unknown-limit-key", "version: 1\nbudgets:\n  - name: b\n    limit: {call: 1}\n", 4, 13,
     "budget 'b': unknown key 'call' (did you mean 'calls'?)"),
    ("bad-per", "version: 1\nbudgets:\n  - name: b\n    limit: {calls: 1}\n    per: call\n", 5, 10,
     "budget 'b': unknown per 'call' (expected run, step, principal, global or label:KEY)"),
    ("scoped-model-limit", "version: 1\nbudgets:\n  - name: b\n    match: {tool: x}\n    limit: {model_tokens: 5}\n",
     3, 5, "budget 'b': model_tokens and model_cost_usd count the whole run: remove match"),
    ("unknown-key-in-tools", "version: 1\ntools:\n  t: {side_efect: read}\n", 3, 7,
     "tool 't': unknown key 'side_efect' (did you mean 'side_effect'?)"),
    ("flush-on-a-write-tool", "version: 1\ntools:\n  t: {side_effect: write, durability: flush}\n", 3, 39,
     "tool 't': durability 'flush' needs side_effect none or read declared here (side_effect is 'write')"),
    ("bad-durability", "version: 1\ntools:\n  t: {side_effect: read, durability: sync}\n", 3, 38,
     "tool 't': unknown durability 'sync' (expected one of fsync, flush)"),
    ("rules-not-a-list", "version: 1\nrules: {name: r}\n", 2, 8, "rules: should be a list"),
    ("rule-not-a-mapping", "version: 1\nrules:\n  - just a string\n", 3, 5,
     "rule #1: should be a mapping (key: value), got 'just a string'"),
    ("bad-on-timeout", "version: 1\napproval: {on_timeout: allow}\n", 2, 24,
     "approval: unknown on_timeout 'allow' (expected one of deny)"),
    ("reason-not-a-string", "version: 1\nrules:\n  - {name: r, decision: deny, reason: [a]}\n", 3, 39,
     "rule 'r': reason: should be a valid string"),
]


@pytest.mark.parametrize("fast", [False, True], ids=["models", "fastcheck"])
@pytest.mark.parametrize(("text", "line", "column", "message"), [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_broken_policy_is_located_precisely(text: str, line: int, column: int, message: str, fast: bool) -> None:
    """Each broken policy raises PolicyError whose only issue has this line, column and message (both validators)."""
    with pytest.raises(PolicyError) as caught:
        Policy(load_policy_text(text, "policy.yaml", fast=fast), "policy.yaml")
    issues = caught.value.issues
    assert [(i.line, i.column, i.message) for i in issues] == [(line, column, message)]
    assert str(issues[0]) == f"policy.yaml:{line}:{column}: {message}"


def test_corpus_is_large_enough() -> None:
    """The corpus covers at least 25 distinct broken policies."""
    assert len(CORPUS) >= 25
    assert len({c[0] for c in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("fast", [False, True], ids=["models", "fastcheck"])
def test_several_errors_are_reported_together_in_file_order(fast: bool) -> None:
    """A file with many mistakes lists them all, sorted by position, not only the first (both validators)."""
    text = textwrap.dedent(
        """\
        version: 1
        tools:
          charge: {side_effect: destructiv}
        budgets:
          - name: b
            limit: {calls: -1}
        rules:
          - name: r
            match: {}
            decision: permit
          - name: r
            when: "args.x >"
            decision: allow
        """
    )
    with pytest.raises(PolicyError) as caught:
        load_policy_text(text, "p.yaml", fast=fast)
    located = [(i.line, i.column) for i in caught.value.issues]
    assert located == [(3, 25), (6, 20), (9, 12), (10, 15), (11, 11), (12, 20)]
    assert (caught.value.file, caught.value.line, caught.value.column) == ("p.yaml", 3, 25)
    assert str(caught.value).count("\n") == 5


def test_from_dict_names_the_path_without_a_line() -> None:
    """Errors in a dict policy have no position (0:0) but name the path."""
    with pytest.raises(PolicyError) as caught:
        Policy.from_dict({"version": 1, "rules": [{"name": "r", "match": {"side_effect": ["read", "x"]},
                                                    "decision": "allow"}]})
    (issue,) = caught.value.issues
    assert (issue.file, issue.line, issue.column) == ("<dict>", 0, 0)
    assert issue.message.startswith("rule 'r': match.side_effect[1]: unknown side_effect 'x'")


def test_missing_file_is_a_policy_error(tmp_path: Path) -> None:
    """A policy path that cannot be read is a PolicyError naming the file."""
    with pytest.raises(PolicyError, match="cannot read policy"):
        Policy.from_yaml(tmp_path / "nope.yaml")


def test_cel_position_in_a_folded_plain_scalar() -> None:
    """A CEL error on the second source line of a plain multi-line scalar points at that line."""
    text = "version: 1\nrules:\n  - name: r\n    when: args.a == 1 &&\n      args.b ===\n    decision: allow\n"
    with pytest.raises(PolicyError) as caught:
        Policy.from_string(text)
    (issue,) = caught.value.issues
    assert (issue.line, issue.column) == (5, 16)


def test_merge_keys_and_recursive_aliases_are_refused() -> None:
    """YAML features that would hide keys (merge `<<`) are errors, not silently applied."""
    text = "version: 1\nbase: &b {decision: allow}\nrules:\n  - <<: *b\n    name: r\n"
    with pytest.raises(PolicyError) as caught:
        Policy.from_string(text)
    assert [(i.line, i.column, i.message) for i in caught.value.issues] == [
        (2, 1, "unknown key 'base' (expected one of approval, budgets, default, ledger, let, read_durability, reload, "
               "rules, sandbox, tools, version)"),
        (4, 5, "YAML merge keys (<<) are not supported"),
        (4, 5, "rule 'r': missing key 'decision'"),
    ]
    with pytest.raises(PolicyError, match="2:8: recursive YAML alias"):
        Policy.from_string("version: 1\nrules: &a\n  - *a\n")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("version: 1\nrules:\n\t- name: x\n", "<p>:3:1: YAML syntax error: found character '\\t' that cannot start any "
         "token while scanning for the next token (indent with spaces, not tabs)"),
        ("version: 1\nrules:\n  - name: r\n    when: !args.a\n    decision: deny\n",
         "<p>:4:11: YAML error: could not determine a constructor for the tag '!args.a' (a value starting with '!' is "
         "a YAML tag: quote the CEL expression, e.g. \"!args.a\")"),
        ("version: 1\nrules:\n  - name: r\n    when: args.to == 'a': b\n    decision: deny\n",
         "<p>:4:25: YAML syntax error: mapping values are not allowed here (': ' inside a condition ends the YAML "
         "value: quote the CEL expression)"),
    ],
)
def test_yaml_mistakes_carry_a_hint(text: str, expected: str) -> None:
    """Tabs, a condition starting with '!' and ': ' inside a condition each say what to do, once."""
    with pytest.raises(PolicyError) as caught:
        Policy.from_string(text, "<p>")
    assert [str(i) for i in caught.value.issues] == [expected]
