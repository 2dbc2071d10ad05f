"""`let:` names with parameters: used as calls, checked at load (arity, unknown names, cycles, capture), shown
by `policy explain`."""

from __future__ import annotations

import pytest

from proctor.calls import Call
from proctor.errors import PolicyError
from proctor.policy import Policy
from proctor.provenance import USER, ProvenanceIndex

POLICY = """version: 1
let:
  corp(a): "normalize(a).endsWith('@corp.example')"
  vouched(v): "from_user(v) || corp(v)"
  all_vouched(xs): "xs.all(r, vouched(r))"
  mail: "tool == 'send_email'"
rules:
  - name: vouched-mail
    match: {tool: send_email}
    when: "mail && all_vouched(args.to) && vouched(args.cc)"
    decision: allow
  - name: else-a-human
    match: {tool: send_email}
    when: "!(all_vouched(args.to) && vouched(args.cc))"
    decision: require_approval
"""


def _call(to: list[str], cc: str, task: str = "mail bob@home.example") -> Call:
    index = ProvenanceIndex()
    index.add(task, (USER,))
    return Call("send_email", {"to": to, "cc": cc}, provenance=index)


def test_a_name_with_parameters_means_its_expression_with_the_arguments() -> None:
    """vouched(v) is from_user(v) || corp(v) for each argument it is given, nested names included."""
    policy = Policy.from_string(POLICY)
    assert policy.decide(_call(["a@corp.example", "bob@home.example"], "c@CORP.example")).outcome == "allow"
    assert policy.decide(_call(["a@corp.example"], "eve@evil.example")).outcome == "require_approval"
    assert policy.decide(_call(["eve@evil.example"], "bob@home.example")).outcome == "require_approval"


@pytest.mark.parametrize(
    ("let", "when", "line", "column", "message"),
    [
        ('f(v): "v == 1"', "f(args.a, args.b)", 7, 12, "when: 'f(v)' takes 1 argument, given 2"),
        ('f(v): "v == 1"', "f", 7, 12, "when: 'f(v)' takes 1 argument: use it as f(v)"),
        ('f: "true"', "f(args.a)", 7, 12, "'f' is a let name without parameters"),
        ('f(v): "v == 1"', "g(args.a)", 7, 12, "when: unknown function 'g'"),
        ('f(v): "w == 1"', "f(1)", 3, 10, "let 'f(v)': unknown variable 'w'"),
        ('f(v): "g(v)"\n  g(w): "f(w)"', "f(1)", 4, 10, "names refer to each other in a cycle (f -> g -> f)"),
        ('f(v): "f(v)"', "f(1)", 3, 10, "cycle (f -> f)"),
        ('f(v, v): "true"', "f(1, 2)", 3, 12, "parameter 'v' is given twice"),
        ('f(args): "true"', "f(1)", 3, 12, "parameter 'args' is a condition variable"),
        ('f(v): "[1].all(v, v == 1)"', "f(1)", 3, 18, "parameter 'v' is also a macro's variable"),
        ('f(l): "[1].all(x, x == l)"', "args.xs.all(x, f(x))", 7, 27,
         "an argument of 'f' uses 'x', the variable of a macro inside 'f(l)'"),
        ('f(v): "v == 1"', "f(carries(args.a))", 7, 14, "carries() takes 2 arguments, got 1"),
        ('f(v): "v == 1"', "f(1) && field_provenance()", 7, 20, "field_provenance() takes 1 argument, got 0"),
        ('f(v): "carries(v)"', "f(1)", 3, 10, "carries() takes 2 arguments, got 1"),
    ],
)
def test_mistakes_in_names_with_parameters_are_located_load_errors(
        let: str, when: str, line: int, column: int, message: str) -> None:
    """Arity, unknown names, recursion (direct or through others), bad parameters and captured arguments are
    refused at load with the line and column in the file."""
    text = f"version: 1\nlet:\n  {let}\nrules:\n  - name: r\n    decision: allow\n    when: \"{when}\"\n"
    with pytest.raises(PolicyError) as caught:
        Policy.from_string(text, source="policy.yaml")
    (issue,) = caught.value.issues
    assert message in issue.message
    assert (issue.line, issue.column) == (line, column), str(issue)


def test_policy_check_refuses_a_wrong_arity_from_the_command_line(tmp_path: pytest.TempPathFactory,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`proctor policy check` prints the located error and exits 1 (the fast check without pydantic agrees)."""
    from pathlib import Path

    from proctor.cli import main

    path = Path(str(tmp_path)) / "p.yaml"
    path.write_text(POLICY.replace("vouched(args.cc)\"\n    decision: allow", "vouched(args.cc, 1)\"\n"
                                                                           "    decision: allow"))
    assert main(["policy", "check", str(path)]) == 1
    assert f"{path}:10:44: rule 'vouched-mail': when: 'vouched(v)' takes 1 argument, given 2" in capsys.readouterr().out
    path.write_text(POLICY)
    assert main(["policy", "check", str(path)]) == 0


def test_explain_shows_each_name_used_and_its_value() -> None:
    """policy explain shows the condition as written and the value of every name it uses, for this call."""
    policy = Policy.from_string(POLICY)
    explained = policy.explain(_call(["a@corp.example"], "eve@evil.example"))
    notes = {t.name: t.note for t in explained.rules}
    assert notes["else-a-human"].startswith("when holds: !(all_vouched(args.to) && vouched(args.cc))")
    assert "all_vouched(args.to) = true" in notes["else-a-human"]
    assert "vouched(args.cc) = false" in notes["else-a-human"]
    assert "mail = true" in notes["vouched-mail"]


def test_names_in_strings_and_fields_are_left_alone() -> None:
    """A parameter's name inside a string literal or as a field name is not replaced by the argument."""
    policy = Policy.from_string(
        "version: 1\nlet:\n  is_to(to): \"to == 'to' || args.to == to\"\nrules:\n  - name: r\n"
        "    decision: allow\n    when: \"is_to('x')\"\n")
    assert policy.decide(Call("t", {"to": "x"})).outcome == "allow"
    assert policy.decide(Call("t", {"to": "to"})).outcome == "deny"
