"""Grant patterns against smuggled values: what `to=*@partner.org` admits and what it never does."""

from __future__ import annotations

import pytest

from proctor.approval import Grant
from proctor.approval.grants import GrantPattern, describe_grant, grant_admits

PARTNER = GrantPattern.parse("*@partner.org")

# The issue's three attacks, and variants of each.
SMUGGLED = [
    "attacker@evil.com, bob@partner.org",
    "attacker@evil.com,bob@partner.org",
    "attacker@evil.com;bob@partner.org",
    "attacker@evil.com\n@partner.org",
    "attacker@evil.com\r\n@partner.org",
    "attacker@evil.com\t@partner.org",
    "attacker@evil.com>@partner.org",
    "attacker@evil.com<@partner.org",
    '"attacker@evil.com"@partner.org',
    "'attacker@evil.com'@partner.org",
    "Bob <attacker@evil.com> bob@partner.org",
    "attacker@evil.com@partner.org",
    "attacker%evil.com@partner.org ",
    "@partner.org",
    "bob@partner.org.evil.com",
    "bob@partner.org\x00",
    "bob\u200b@partner.org",
    "bob\u3164@partner.org",
    "bo\u034fb@partner.org",
    "b\u043eb@partner.org",  # Cyrillic o
    "bob@p\u0430rtner.org",  # Cyrillic a in the domain is a different domain
    "\uff42ob@partner.org",  # fullwidth b
    "bob\u00a0@partner.org",
    "bob@partner.org\u202e",
    "x" * 2000 + "@partner.org",
]


@pytest.mark.parametrize("value", SMUGGLED)
def test_smuggled_recipients_are_not_admitted(value: str) -> None:
    """None of the free-text tricks passes `*@partner.org`; each call goes back to a human."""
    assert not PARTNER.admits(value)
    assert not grant_admits(Grant("send_email", {"to": "*@partner.org"}), "send_email", {"to": value})


@pytest.mark.parametrize("value", ["bob@partner.org", "bob.smith+tag@partner.org", "b-o_b=1%x~@partner.org"])
def test_a_single_mailbox_is_admitted(value: str) -> None:
    """What the human meant: one local part of word characters at that domain."""
    assert PARTNER.admits(value)


def test_only_strings_and_integers_are_matched() -> None:
    """Lists, mappings, booleans, None and floats never match; integers match their digits."""
    for value in (["bob@partner.org"], {"to": "bob@partner.org"}, None, True, 1.0):
        assert not GrantPattern.parse("*").admits(value)
    assert GrantPattern.parse("4*").admits(42) and not GrantPattern.parse("4*").admits(52)


def test_paths_stay_inside_their_directory() -> None:
    """`*` stays in one segment; `**` crosses `/` but never through '.', '..' or an empty segment."""
    one, deep = GrantPattern.parse("/data/*"), GrantPattern.parse("/data/**")
    assert one.admits("/data/report.csv") and not one.admits("/data/a/b.csv")
    assert not one.admits("/data/..") and not one.admits("/data/.")
    assert deep.admits("/data/a/b.csv")
    for bad in ("/data/../etc/passwd", "/data/a/../../etc", "/data//etc", "/data/./x", "/data/a/.."):
        assert not deep.admits(bad), bad


def test_literal_patterns_match_exactly() -> None:
    """A pattern without wildcards admits exactly itself."""
    pattern = GrantPattern.parse("bob@partner.org")
    assert pattern.literal and pattern.admits("bob@partner.org")
    assert not pattern.admits("BOB@partner.org") and not pattern.admits("bob@partner.orgx")
    assert pattern.describe() == "exactly 'bob@partner.org'"


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty pattern"),
    ("*@partner.org ", "printable ASCII without spaces"),
    ("b?b@partner.org", "only \\* and \\*\\* are wildcards"),
    ("[a-z]*@partner.org", "only \\* and \\*\\* are wildcards"),
    ("\\*@x", "only \\* and \\*\\* are wildcards"),
    ("***", "not \\*\\*\\*"),
    ("*@p\u0430rtner.org", "printable ASCII"),
])
def test_bad_patterns_are_refused(text: str, message: str) -> None:
    """Patterns with classes, escapes, spaces or non-ASCII are refused with a one-line reason."""
    with pytest.raises(ValueError, match=message):
        GrantPattern.parse(text)


def test_an_unparsable_stored_pattern_admits_nothing() -> None:
    """A grant holding a pattern that does not parse (written elsewhere) covers no call."""
    assert not grant_admits(Grant("t", {"x": "a b"}), "t", {"x": "a b"})
    assert not grant_admits(Grant("t", {"x": "*"}), "other", {"x": "a"})
    assert not grant_admits(Grant("t", {"x": "*"}), "t", {})
    assert grant_admits(Grant("t", {}), "t", {"anything": "at all, even this"})


def test_describe_grant_shows_what_is_admitted_before_it_is_given() -> None:
    """The preview names the wildcard's class, whether this call is covered, and smuggling it refuses."""
    lines = describe_grant(Grant("send_email", {"to": "*@partner.org"}), {"to": "bob@partner.org"})
    text = "\n".join(lines)
    assert "to: <one or more word characters> then '@partner.org'" in text
    assert "this call's to='bob@partner.org': admitted" in text
    assert "never e.g. 'attacker@evil.com, bob@partner.org'" in text
    lines = describe_grant(Grant("send_email", {"to": "*@partner.org"}), {"to": "x@other.org"})
    assert any("NOT admitted" in line for line in lines)
    assert describe_grant(Grant("send_email", {})) == [
        "every later call of send_email, with any arguments, for the rest of the run"]


def test_the_issue_attacks_through_the_gate_each_go_back_to_a_human() -> None:
    """After a grant for to=*@partner.org, every smuggled recipient is asked about again (and here denied)."""
    from proctor.approval import ApprovalDecision, ApprovalRequest, CallbackApprover
    from proctor.errors import ApprovalDenied
    from proctor.gate import Gate
    from proctor.policy import Policy
    from proctor.testing import InMemoryAudit
    from proctor.tools import tool

    sent: list[str] = []
    asked: list[str] = []

    @tool(side_effect="external")
    def send_email(to: str, body: str) -> str:
        """Send an email.

        Args:
            to: Recipient.
            body: Text.
        """
        sent.append(to)
        return "sent"

    def human(request: ApprovalRequest) -> ApprovalDecision:
        asked.append(str(request.args["to"]))
        if len(asked) == 1:
            return ApprovalDecision("grant", request.binding, "carol", "partners are fine",
                                    grant=Grant("send_email", {"to": "*@partner.org"}))
        return ApprovalDecision.deny(request, "carol", "not what I granted")

    policy = Policy.from_dict({"version": 1, "rules": [{"name": "ask", "match": {"tool": "send_email"},
                                                         "decision": "require_approval"}]})
    gate = Gate(policy, approver=CallbackApprover(human), audit=InMemoryAudit(), tools=[send_email])
    ctx = gate.start_run(principal="alice")
    gate.call("send_email", {"to": "bob@partner.org", "body": "1"}, context=ctx)
    gate.call("send_email", {"to": "eve@partner.org", "body": "2"}, context=ctx)  # covered by the grant
    attacks = ["attacker@evil.com, bob@partner.org", "attacker@evil.com\n@partner.org",
               "attacker@evil.com>@partner.org"]
    for attack in attacks:
        with pytest.raises(ApprovalDenied):
            gate.call("send_email", {"to": attack, "body": "x"}, context=ctx)
    assert sent == ["bob@partner.org", "eve@partner.org"]
    assert asked == ["bob@partner.org", *attacks]
