"""Policy.decide, facts, fingerprints, indexing and describe_tool."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from proctor.calls import Call, HistoryEntry, RunInfo
from proctor.policy import Policy
from proctor.policy.conditions import Condition

DESIGN = """\
version: 1
default: deny
tools:
  get_weather:  {side_effect: read}
  send_email:   {side_effect: external, cost: 1}
  charge_card:  {side_effect: destructive, cost: 10, redact: [card_number], timeout: 1m30s}
  ping:         {side_effect: none, durability: flush}
budgets:
  - name: run-calls
    limit: {calls: 50}
rules:
  - name: reads
    match: {side_effect: [none, read]}
    decision: allow
  - name: internal-mail
    match: {tool: send_email}
    when: "args.to.endsWith('@example.com')"
    decision: allow
  - name: external-mail
    match: {tool: send_email}
    when: "!args.to.endsWith('@example.com')"
    decision: require_approval
    reason: mail leaving the company needs a human
  - name: no-exfiltration
    match: {side_effect: [external, destructive]}
    when: "history.exists(c, c.tool == 'read_secret')"
    decision: deny
    reason: nothing leaves after a secret was read
approval:
  timeout: 5m
"""


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy.from_string(DESIGN, source="design.yaml")


def secret_read() -> tuple[HistoryEntry, ...]:
    return (HistoryEntry("read_secret", {}, "read", "allow", "ok"),)


def test_allow_by_side_effect_class(policy: Policy) -> None:
    """A read tool is allowed by the rule matching its class."""
    d = policy.decide(Call("get_weather", {"city": "Paris"}))
    assert (d.outcome, d.rules, d.reason) == ("allow", ("reads",), "allowed by rule 'reads'")
    assert d.policy_sha256 == policy.sha256


def test_allow_by_condition(policy: Policy) -> None:
    """A `when` that holds allows."""
    d = policy.decide(Call("send_email", {"to": "bob@example.com"}))
    assert (d.outcome, d.rules) == ("allow", ("internal-mail",))


def test_require_approval_with_reason(policy: Policy) -> None:
    """require_approval carries the rule's reason."""
    d = policy.decide(Call("send_email", {"to": "eve@evil.test"}))
    assert (d.outcome, d.rules, d.reason) == (
        "require_approval", ("external-mail",), "mail leaving the company needs a human")


def test_deny_beats_allow_and_approval(policy: Policy) -> None:
    """A matching deny wins over a matching allow."""
    d = policy.decide(Call("send_email", {"to": "bob@example.com"}, history=secret_read()))
    assert (d.outcome, d.rules, d.reason) == ("deny", ("no-exfiltration",), "nothing leaves after a secret was read")


def test_no_match_gives_default(policy: Policy) -> None:
    """A call no rule matches gets the default, with a reason saying so."""
    d = policy.decide(Call("charge_card", {"card_number": "4111"}))
    assert (d.outcome, d.rules) == ("deny", ())
    assert d.reason == "no rule matched; the policy default is deny"


def test_default_allow_and_require_approval() -> None:
    """The default can be allow or require_approval."""
    for default in ("allow", "require_approval"):
        p = Policy.from_dict({"version": 1, "default": default})
        assert p.decide(Call("anything")).outcome == default


def test_missing_argument_denies_naming_the_rule(policy: Policy) -> None:
    """A condition reading a missing argument makes the call a deny naming rule and error."""
    d = policy.decide(Call("send_email", {"subject": "hi"}))
    assert d.outcome == "deny"
    assert d.rules == ("internal-mail", "external-mail")
    assert "rule 'internal-mail': condition failed: no such key 'to' in args" in d.reason


def test_wrong_type_denies(policy: Policy) -> None:
    """A condition applied to a value of the wrong type denies."""
    d = policy.decide(Call("send_email", {"to": 42}))
    assert d.outcome == "deny"
    assert "condition failed" in d.reason


def test_erroring_allow_rule_denies_even_when_approval_matched() -> None:
    """An erroring condition counts as a matching deny: it beats require_approval."""
    p = Policy.from_dict({"version": 1, "rules": [
        {"name": "ask", "match": {"tool": "t"}, "decision": "require_approval"},
        {"name": "ok-if", "match": {"tool": "t"}, "when": "args.n > 1", "decision": "allow"},
    ]})
    d = p.decide(Call("t", {}, side_effect="read"))
    assert (d.outcome, d.rules) == ("deny", ("ok-if",))
    assert p.decide(Call("t", {"n": 0})).outcome == "require_approval"


def test_non_bool_condition_denies() -> None:
    """A condition that yields a non-boolean is a deny, not a truthy allow."""
    p = Policy.from_dict({"version": 1, "rules": [{"name": "r", "when": "args.n", "decision": "allow"}]})
    d = p.decide(Call("t", {"n": 3}))
    assert d.outcome == "deny"
    assert "not true or false" in d.reason


def test_unconvertible_argument_denies() -> None:
    """An argument CEL cannot represent (a set) denies instead of crashing."""
    p = Policy.from_dict({"version": 1, "rules": [{"name": "r", "when": "size(args) > 0", "decision": "allow"}]})
    d = p.decide(Call("t", {"n": {1, 2}}))
    assert d.outcome == "deny"
    assert "CEL cannot use" in d.reason


def test_float_and_int_arguments() -> None:
    """Comparisons mix int and double; arithmetic on a mix is a deny that says how to fix it."""
    p = Policy.from_dict({"version": 1, "rules": [
        {"name": "cmp", "match": {"tool": "pay"}, "when": "args.amount > 100", "decision": "deny"},
        {"name": "math", "match": {"tool": "calc"}, "when": "args.amount * 2 > 100", "decision": "allow"},
    ], "default": "allow"})
    assert p.decide(Call("pay", {"amount": 150.5})).outcome == "deny"
    assert p.decide(Call("pay", {"amount": 99})).outcome == "allow"
    d = p.decide(Call("calc", {"amount": 1.5}))
    assert d.outcome == "deny" and "double(x)" in d.reason


def test_all_variables_are_visible() -> None:
    """tool, args, side_effect, history, run and usage reach conditions."""
    when = ("tool == 't' && args.a == 1 && side_effect == 'write' && size(history) == 1 && "
            "history[0].status == 'failed' && run.principal == 'alice' && run.labels.env == 'prod' && "
            "run.step == 2 && usage.calls.calls == 3")
    p = Policy.from_dict({"version": 1, "rules": [{"name": "r", "when": when, "decision": "allow"}]})
    call = Call("t", {"a": 1}, side_effect="write",
                history=(HistoryEntry("x", {}, "read", "allow", "failed"),),
                run=RunInfo("run_1", 2, "alice", {"env": "prod"}), usage={"calls": {"calls": 3}})
    assert p.decide(call).outcome == "allow"


def test_globs_lists_and_classes_match() -> None:
    """match.tool takes a name, a glob or a list; side_effect a class or a list; both must hold."""
    p = Policy.from_dict({"version": 1, "rules": [
        {"name": "db", "match": {"tool": "db_*"}, "decision": "allow"},
        {"name": "two", "match": {"tool": ["a", "b?"]}, "decision": "allow"},
        {"name": "both", "match": {"tool": "c", "side_effect": "read"}, "decision": "allow"},
    ]})
    assert p.decide(Call("db_query")).rules == ("db",)
    assert p.decide(Call("a")).rules == ("two",)
    assert p.decide(Call("bx")).rules == ("two",)
    assert p.decide(Call("bxx")).outcome == "deny"
    assert p.decide(Call("c", side_effect="read")).outcome == "allow"
    assert p.decide(Call("c", side_effect="write")).outcome == "deny"


def test_policy_tools_override_declared_side_effect(policy: Policy) -> None:
    """The policy's tools: section overrides what the tool declares."""
    assert policy.decide(Call("get_weather", side_effect="destructive")).outcome == "allow"
    assert policy.decide(Call("mystery", side_effect="read")).outcome == "allow"
    assert policy.decide(Call("mystery")).outcome == "deny"


def test_facts(policy: Policy) -> None:
    """facts(): policy entry first, then the declaration, and destructive when undeclared."""
    f = policy.facts("charge_card", "read", 1)
    assert (f.side_effect, f.cost, f.timeout_s, f.redact, f.durability) == (
        "destructive", 10, 90.0, ("card_number",), "fsync")
    assert policy.facts("ping").durability == "flush"
    g = policy.facts("unknown_tool")
    assert (g.side_effect, g.cost, g.timeout_s, g.redact) == ("destructive", 0, None, ())
    assert policy.facts("unknown_tool", "write", 3).side_effect == "write"
    assert policy.facts("unknown_tool", "write", 3).cost == 3
    assert policy.facts("send_email", None, 7).cost == 1


def test_reads_default_to_flushed_intents_and_the_policy_can_switch_back(policy: Policy) -> None:
    """A none/read tool's intent is flushed unless the policy says fsync; every other class is fsynced."""
    assert policy.facts("get_weather").durability == "flush"
    assert policy.facts("undeclared", "read").durability == "flush"
    assert policy.facts("send_email").durability == "fsync"
    assert policy.facts("undeclared").durability == "fsync"  # destructive
    strict = Policy.from_dict({"version": 1, "read_durability": "fsync",
                               "tools": {"get_weather": {"side_effect": "read"},
                                         "ping": {"side_effect": "none", "durability": "flush"}}})
    assert strict.facts("get_weather").durability == "fsync"
    assert strict.facts("undeclared", "read").durability == "fsync"
    assert strict.facts("ping").durability == "flush"  # a tool's own setting wins


def test_approval_settings_and_read_access(policy: Policy) -> None:
    """approval, rules, budgets, default and source are readable."""
    assert policy.approval.timeout_s == 300.0 and policy.approval.on_timeout == "deny"
    assert Policy.from_dict({"version": 1}).approval.timeout_s == 300.0
    assert [r.name for r in policy.rules] == ["reads", "internal-mail", "external-mail", "no-exfiltration"]
    assert [b.name for b in policy.budgets] == ["run-calls"]
    assert policy.default == "deny" and policy.source == "design.yaml"


def test_sha256_ignores_layout_order_and_comments() -> None:
    """Reordered keys, rules and list items, comments and defaults spelled out keep the fingerprint."""
    a = Policy.from_string(DESIGN)
    lines = DESIGN.replace("default: deny\n", "").replace("version: 1\n", "# ops policy\nversion: 1\ndefault: deny\n")
    b = Policy.from_string(lines.replace("side_effect: [none, read]", "side_effect: [read, none]"))
    data: dict[str, Any] = {
        "approval": {"on_timeout": "deny", "timeout": "300s"},
        "rules": list(reversed([r.model_dump(exclude_none=True) for r in a.rules])),
        "budgets": [{"name": "run-calls", "limit": {"calls": 50}, "per": "run"}],
        "tools": {
            "ping": {"durability": "flush", "side_effect": "none"},
            "charge_card": {"redact": ["card_number"], "cost": 10, "side_effect": "destructive", "timeout": "90s"},
            "send_email": {"cost": 1, "side_effect": "external"},
            "get_weather": {"side_effect": "read"},
        },
        "version": 1,
    }
    for rule in data["rules"]:
        if "match" in rule:
            rule["match"] = {k: list(v) for k, v in rule["match"].items()}
    c = Policy.from_dict(data)
    assert a.sha256 == b.sha256 == c.sha256
    assert len(a.sha256) == 64


@pytest.mark.parametrize("change", [
    ("decision: allow\n  - name: internal-mail", "decision: deny\n  - name: internal-mail"),
    ("'@example.com')\"\n    decision: allow", "'@example.org')\"\n    decision: allow"),
    ("cost: 10", "cost: 11"),
    ("timeout: 5m", "timeout: 6m"),
    ("calls: 50", "calls: 51"),
    ("reason: mail leaving the company needs a human", "reason: ask a human"),
    ("default: deny", "default: allow"),
])
def test_sha256_changes_with_meaning(change: tuple[str, str]) -> None:
    """Any change of meaning changes the fingerprint."""
    assert change[0] in DESIGN
    assert Policy.from_string(DESIGN).sha256 != Policy.from_string(DESIGN.replace(*change, 1)).sha256


def test_rules_that_cannot_match_are_never_evaluated() -> None:
    """A `when` that would fail is not evaluated for tools or classes its rule does not match."""
    p = Policy.from_dict({"version": 1, "default": "allow", "rules": [
        {"name": "other-tool", "match": {"tool": "other"}, "when": "args.missing == 1", "decision": "deny"},
        {"name": "other-glob", "match": {"tool": "zz*"}, "when": "args.missing == 1", "decision": "deny"},
        {"name": "other-class", "match": {"side_effect": "destructive"}, "when": "args.missing == 1",
         "decision": "deny"},
    ]})
    d = p.decide(Call("mine", {}, side_effect="read"))
    assert (d.outcome, d.rules) == ("allow", ())
    candidates = p.candidates("mine", "read")
    assert candidates.all == ()
    assert [r.name for r in p.candidates("zzz", "read").all] == ["other-glob"]


def test_lower_rules_are_skipped_once_a_deny_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a deny holds, allow/approval conditions are not evaluated at all."""
    p = Policy.from_dict({"version": 1, "rules": [
        {"name": "no", "match": {"tool": "t"}, "decision": "deny"},
        {"name": "yes", "match": {"tool": "t"}, "when": "args.a == 1", "decision": "allow"},
    ]})
    calls: list[str] = []
    original = Condition.evaluate

    def spy(self: Condition, activation: Any) -> bool:
        calls.append(self.source)
        return original(self, activation)

    monkeypatch.setattr(Condition, "evaluate", spy)
    assert p.decide(Call("t", {"a": 1})).outcome == "deny"
    assert calls == []


def test_candidate_cache_is_bounded() -> None:
    """The (tool, class) cache does not grow without bound."""
    p = Policy.from_dict({"version": 1, "rules": [{"name": "g", "match": {"tool": "x*"}, "decision": "allow"}]})
    for i in range(5000):
        p.decide(Call(f"x{i}", side_effect="read"))
    info = p.candidates.cache_info()  # type: ignore[attr-defined]
    assert info.currsize <= info.maxsize


def test_decide_is_thread_safe(policy: Policy) -> None:
    """Many threads deciding at once get the same answers as one thread."""
    calls = [Call("send_email", {"to": f"u{i}@example.com" if i % 2 else f"u{i}@x.test"}) for i in range(200)]
    expected = [policy.decide(c).outcome for c in calls]
    results: list[list[str]] = []

    def work() -> None:
        results.append([policy.decide(c).outcome for c in calls])

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 8


def test_describe_tool(policy: Policy) -> None:
    """describe_tool gives one line built from the rules matching the tool."""
    assert policy.describe_tool("get_weather") == "allowed"
    line = policy.describe_tool("send_email")
    assert line.startswith("denied when history.exists(c, c.tool == 'read_secret')")
    assert ("needs human approval when !args.to.endsWith('@example.com') "
            "(mail leaving the company needs a human)") in line
    assert line.endswith("otherwise denied (policy default)")
    assert policy.describe_tool("whatever", "read") == "allowed"
    assert "\n" not in line
    assert Policy.from_dict({"version": 1}).describe_tool("x") == "denied (policy default)"


def test_repr_mentions_source_and_fingerprint(policy: Policy) -> None:
    """repr is short and useful in logs."""
    assert repr(policy).startswith("Policy('design.yaml', rules=4, sha256=")


def test_explain_traces_every_rule(policy: Policy) -> None:
    """Policy.explain gives the decision and, per rule, whether and why it matched."""
    result = policy.explain(Call("send_email", {}))
    assert result.decision == policy.decide(Call("send_email", {}))
    assert result.side_effect == "external"
    notes = {t.name: (t.matched, t.note) for t in result.rules}
    assert notes["reads"] == (False, "side_effect external is not none, read")
    matched, note = notes["internal-mail"]
    assert matched and "condition failed (counts as deny): no such key 'to'" in note
    assert notes["no-exfiltration"] == (False, "when does not hold: history.exists(c, c.tool == 'read_secret')")
    other = policy.explain(Call("get_weather")).rules
    assert [t.note for t in other if t.name == "internal-mail"] == ["tool 'get_weather' is not send_email"]
