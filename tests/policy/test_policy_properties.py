"""Hypothesis properties of combining: allow never overrides a deny, no rules gives the default, order is moot."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from tiers import examples

from proctor.calls import SIDE_EFFECTS, Call
from proctor.policy import Policy

TOOLS = ["send", "read", "charge", "sendmail"]
# Conditions that hold, fail, or error (missing key, wrong type) depending on the call.
CONDITIONS = [None, "true", "false", "args.n > 1", "args.n == 0", "size(args.s) > 2", "tool.startsWith('s')",
              "side_effect == 'read'", "history.exists(h, h.tool == 'read')"]
SETTINGS = settings(max_examples=examples(60), deadline=None)

matches = st.one_of(
    st.none(),
    st.fixed_dictionaries({"tool": st.sampled_from([*TOOLS, "send*", ["read", "charge"]])}),
    st.fixed_dictionaries({"side_effect": st.sampled_from([*SIDE_EFFECTS, ["write", "external"]])}),
    st.fixed_dictionaries({"tool": st.sampled_from(TOOLS), "side_effect": st.sampled_from(SIDE_EFFECTS)}),
)


@st.composite
def rule_bodies(draw: st.DrawFn, decision: st.SearchStrategy[str] | None = None) -> dict[str, Any]:
    outcomes = st.sampled_from(["allow", "deny", "require_approval"]) if decision is None else decision
    body: dict[str, Any] = {"decision": draw(outcomes)}
    match = draw(matches)
    if match is not None:
        body["match"] = match
    when = draw(st.sampled_from(CONDITIONS))
    if when is not None:
        body["when"] = when
    return body


def make_policy(bodies: list[dict[str, Any]], default: str = "deny") -> Policy:
    rules = [{"name": f"r{i}", **body} for i, body in enumerate(bodies)]
    return Policy.from_dict({"version": 1, "default": default, "rules": rules})


calls = st.builds(
    Call,
    tool=st.sampled_from(TOOLS),
    args=st.one_of(st.just({}), st.fixed_dictionaries({"n": st.integers(-2, 3)}),
                   st.fixed_dictionaries({"n": st.floats(-2, 3), "s": st.text(max_size=4)}),
                   st.fixed_dictionaries({"n": st.text(max_size=2)})),
    side_effect=st.sampled_from(SIDE_EFFECTS),
)


@SETTINGS
@given(st.lists(rule_bodies(), max_size=6), rule_bodies(st.just("allow")), calls)
def test_adding_an_allow_rule_never_overrides_a_rule_that_denies(
    bodies: list[dict[str, Any]], extra: dict[str, Any], call: Call
) -> None:
    """A deny (or require_approval) decided by rules stays so when any allow rule is added."""
    before = make_policy(bodies).decide(call)
    after = make_policy([*bodies, extra]).decide(call)
    if before.rules and before.outcome in ("deny", "require_approval"):
        assert after.outcome == before.outcome or after.outcome == "deny"
    if before.outcome == "deny" and before.rules:
        assert after.outcome == "deny"
    assert not (before.outcome != "allow" and before.rules and after.outcome == "allow")


@SETTINGS
@given(st.sampled_from(["allow", "deny", "require_approval"]), calls)
def test_a_policy_without_rules_always_yields_its_default(default: str, call: Call) -> None:
    """No rules: every call gets the default and no rule names."""
    decision = make_policy([], default).decide(call)
    assert (decision.outcome, decision.rules) == (default, ())


@SETTINGS
@given(st.lists(rule_bodies(), min_size=1, max_size=7), st.randoms(use_true_random=False), calls)
def test_decisions_do_not_depend_on_rule_order(bodies: list[dict[str, Any]], rnd: Any, call: Call) -> None:
    """Shuffling the rules changes neither the outcome nor the set of deciding rules, nor the fingerprint."""
    named = [{"name": f"r{i}", **b} for i, b in enumerate(bodies)]
    shuffled = list(named)
    rnd.shuffle(shuffled)
    a = Policy.from_dict({"version": 1, "rules": named})
    b = Policy.from_dict({"version": 1, "rules": shuffled})
    da, db = a.decide(call), b.decide(call)
    assert da.outcome == db.outcome
    assert sorted(da.rules) == sorted(db.rules)
    assert set(da.reason.split("; ")) == set(db.reason.split("; "))
    assert a.sha256 == b.sha256


@SETTINGS
@given(st.lists(rule_bodies(), max_size=6), st.sampled_from(["allow", "deny", "require_approval"]), calls)
def test_the_decision_fixed_in_advance_is_the_evaluated_one(
    bodies: list[dict[str, Any]], default: str, call: Call
) -> None:
    """Rules without conditions decide as if each had `when: true` evaluated, and `fixed_decision` agrees."""
    policy = make_policy(bodies, default)
    evaluated = make_policy([{"when": "true", **body} for body in bodies], default)
    a, b = policy.decide(call), evaluated.decide(call)
    assert (a.outcome, a.rules, a.reason) == (b.outcome, b.rules, b.reason)
    assert call.side_effect is not None
    fixed = policy.fixed_decision(call.tool, call.side_effect)
    if all("when" not in body for body in bodies):
        assert fixed == policy.decide(call)
    elif fixed is not None:
        assert fixed == policy.decide(call)
