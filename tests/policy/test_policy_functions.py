"""proctor's CEL functions: normalize, email_domain, the strings extension and the list aggregates."""

from __future__ import annotations

import pytest

from proctor.calls import Call
from proctor.policy import Policy
from proctor.policy.conditions import compile_condition
from proctor.policy.functions import FUNCTIONS, CelFunction, cel_sum, email_domain, normalize, register


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("bob@Competitor.COM", "bob@competitor.com"),
        ("  bob@competitor.com \t", "bob@competitor.com"),
        ("bob@compet\u200bitor.com", "bob@competitor.com"),
        ("\ufeffbob@competitor.com\u2060", "bob@competitor.com"),
        ("".join(chr(ord(c) + 0xFEE0) for c in "BOB@competitor.com"), "bob@competitor.com"),  # full-width (NFKC)
        ("STRASSE Straße", "strasse strasse"),  # case folding, not just lower()
        ("a\n\n  b", "a b"),
        ("plain", "plain"),
    ],
)
def test_normalize(raw: str, expected: str) -> None:
    """normalize() is NFKC, case-folded, without invisible characters, whitespace collapsed."""
    assert normalize(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("bob@Competitor.COM", "competitor.com"),
        ("bob@competitor.com.", "competitor.com"),
        ("bob@competitor.com ", "competitor.com"),
        ("bob@competitor.com>", "competitor.com"),
        ("Bob Smith <bob@Competitor.com>", "competitor.com"),
        ("bob@compe\u200btitor.com", "competitor.com"),
        ('"a@b"@competitor.com', "competitor.com"),
        ("no address", ""),
    ],
)
def test_email_domain(raw: str, expected: str) -> None:
    """email_domain() finds the one domain whatever the spelling around it."""
    assert email_domain(raw) == expected


@pytest.mark.parametrize("raw", ["a@ok.example, b@competitor.com", "a@ok.example b@x.com", "<a@x.com> <b@y.com>"])
def test_email_domain_refuses_several_addresses(raw: str) -> None:
    """Several addresses in one value are an error (the condition then denies), never the last one's domain."""
    with pytest.raises(ValueError, match="one address"):
        email_domain(raw)


def test_deny_rule_holds_on_disguised_recipients() -> None:
    """A deny rule written with email_domain() catches every disguise the issue lists."""
    policy = Policy.from_dict({
        "version": 1, "default": "allow", "tools": {"send_email": {"side_effect": "external"}},
        "rules": [{"name": "no-competitor", "match": {"tool": "send_email"},
                   "when": "email_domain(args.to) == 'competitor.com'", "decision": "deny"}],
    })  # fmt: skip
    for to in ("x@Competitor.COM", "x@competitor.com.", "x@competitor.com ", "x@compe\u200btitor.com",
               "x@competitor.com>", "X <x@competitor.com>", "a@ok.example, x@competitor.com"):
        assert policy.decide(Call("send_email", {"to": to})).outcome == "deny", to
    assert policy.decide(Call("send_email", {"to": "x@partner.example"})).outcome == "allow"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("'Hello'.lowerAscii() == 'hello'", True),
        ("upperAscii('abc') == 'ABC'", True),
        ("'a,b,c'.split(',') == ['a', 'b', 'c']", True),
        ("'a,b,c'.split(',', 2) == ['a', 'b,c']", True),
        ("['a', 'b'].join('-') == 'a-b'", True),
        ("'aaa'.replace('a', 'b', 2) == 'bba'", True),
        ("'hello'.indexOf('l') == 2 && 'hello'.lastIndexOf('l') == 3", True),
        ("'hello'.substring(1, 3) == 'el' && 'hello'.charAt(1) == 'e'", True),
        ("'  x '.trim() == 'x'", True),
        ("sum([1, 2, 3]) == 6", True),
        ("sum([1, 2.5]) == 3.5", True),
        ("sum([]) == 0", True),
        ("[3, 1, 2].max() == 3 && min([3, 1, 2]) == 1", True),
    ],
)
def test_extension_functions(source: str, expected: bool) -> None:
    """The strings extension and the aggregates behave as in cel-go."""
    assert compile_condition(source).evaluate({}) is expected


def test_sum_semantics() -> None:
    """sum(): ints stay ints, a double makes a double, anything else is an error."""
    assert cel_sum([1, 2]) == 3 and isinstance(cel_sum([1, 2]), int)
    assert isinstance(cel_sum([1, 2.0]), float)
    assert cel_sum([]) == 0
    for bad in ([True], ["1"], [None], "12"):
        with pytest.raises(TypeError):
            cel_sum(bad)
    with pytest.raises(OverflowError):
        cel_sum([2**62, 2**62])


def test_sum_over_history_caps_a_run_total() -> None:
    """A rule can cap the total wired in a run with sum() over history."""
    policy = Policy.from_dict({
        "version": 1, "default": "allow", "tools": {"wire": {"side_effect": "destructive"}},
        "rules": [{"name": "cap", "match": {"tool": "wire"}, "decision": "deny",
                   "when": "sum(history.filter(h, h.tool == 'wire' && h.status == 'ok')"
                           ".map(h, double(h.args.amount))) + double(args.amount) > 1000.0"}],
    })  # fmt: skip
    from proctor.calls import HistoryEntry

    history = [HistoryEntry("wire", {"amount": 400}, "destructive", "allow", "ok"),
               HistoryEntry("wire", {"amount": 500.5}, "destructive", "allow", "ok"),
               HistoryEntry("wire", {"amount": 900}, "destructive", "deny", "denied")]
    assert policy.decide(Call("wire", {"amount": 99}, history=history)).outcome == "allow"
    assert policy.decide(Call("wire", {"amount": 100}, history=history)).outcome == "deny"


def test_function_errors_fail_closed() -> None:
    """A function given the wrong type denies the call, naming what went wrong."""
    policy = Policy.from_dict({
        "version": 1, "default": "deny", "tools": {"t": {"side_effect": "read"}},
        "rules": [{"name": "r", "when": "normalize(args.x) == 'a'", "decision": "allow"}],
    })  # fmt: skip
    decision = policy.decide(Call("t", {"x": 5}))
    assert decision.outcome == "deny"
    assert "normalize() takes a string, got int" in decision.reason


def test_registered_function_is_known_and_bound_per_call() -> None:
    """A function registered with bind() is checked at load time and sees the call being decided."""
    register(CelFunction("test_tool_name_is", bind=lambda call: lambda name: call.tool == name))
    try:
        policy = Policy.from_dict({
            "version": 1, "default": "deny",
            "rules": [{"name": "r", "when": "test_tool_name_is('t')", "decision": "allow"}],
        })  # fmt: skip
        assert policy.decide(Call("t", side_effect="read")).outcome == "allow"
        assert policy.decide(Call("u", side_effect="read")).outcome == "deny"
    finally:
        del FUNCTIONS["test_tool_name_is"]


def test_only_called_functions_enter_the_condition() -> None:
    """A condition lists exactly the registered functions it calls."""
    condition = compile_condition("normalize(args.a) == 'x' && args.b.lowerAscii() == 'y' && size(args.c) > 0")
    assert condition.functions == ("lowerAscii", "normalize")
    assert compile_condition("args.a == 'x'").functions == ()


def test_register_refuses_bad_definitions() -> None:
    """register() wants exactly one of fn and bind, and an identifier."""
    with pytest.raises(ValueError):
        register(CelFunction("x"))
    with pytest.raises(ValueError):
        register(CelFunction("no good", fn=len))


def test_a_failing_function_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """The deny reason names the error; the cel package's own warning is not printed too."""
    caplog.set_level("WARNING")
    with pytest.raises(Exception, match="one address"):
        compile_condition("email_domain('a@x.example, b@y.example') == 'x'").evaluate({})
    assert [r for r in caplog.records if r.name.startswith("cel")] == []
