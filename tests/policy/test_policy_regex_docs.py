"""docs/policy.md, "Regular expressions": every worked example is loaded and run, every escaping row holds."""

from __future__ import annotations

import re
from pathlib import Path

import cel
import pytest
import yaml

from proctor.policy import Policy
from proctor.policy.cases import load_cases, run_cases
from proctor.policy.conditions import ConditionError, compile_condition

DOC = (Path(__file__).resolve().parents[2] / "docs" / "policy.md").read_text()
SECTION = DOC[DOC.index("### Regular expressions"):]
SECTION = SECTION[: SECTION.index("\n## ") if "\n## " in SECTION else len(SECTION)]
SECTION = SECTION[: SECTION.index("\n### ", 5) if "\n### " in SECTION[5:] else len(SECTION)]


def _block(marker: str) -> str:
    found = re.search(r"```yaml\n(# " + marker + r"\n.*?)```", SECTION, flags=re.DOTALL)
    assert found is not None, marker
    return found.group(1)


def test_the_worked_examples_load_and_decide_as_their_cases_say() -> None:
    """The example policy loads (every pattern compiled at load) and passes its cases."""
    policy = Policy.from_string(_block("regex-examples"))
    cases = load_cases(_block("regex-cases"), "<docs>", policy)
    results = run_cases(policy, cases)
    assert len(results) >= 10
    assert [r.label for r in results if not r.passed] == []


ROWS = re.findall(r"^\| `(when: .*?)` — .*?\| `(.*?)` \| (.*?) \|$", SECTION, flags=re.MULTILINE)


def test_there_are_escaping_rows() -> None:
    """The table keeps its four ways of writing the same pattern."""
    assert len(ROWS) == 4


@pytest.mark.parametrize(("line", "cel_text", "re2"), ROWS)
def test_each_escaping_row_holds(line: str, cel_text: str, re2: str) -> None:
    """YAML gives CEL what the row says, and CEL gives RE2 the pattern (or the row's error)."""
    when = yaml.safe_load(line)["when"]
    assert when == cel_text
    if not re2.startswith("`"):
        with pytest.raises(ConditionError, match=r"syntax error.*backslash in a CEL string.*raw string"):
            compile_condition(when)
        return
    compile_condition(when)
    literal = re.search(r"matches\((.*)\)$", when)
    assert literal is not None
    assert cel.compile(literal.group(1)).execute({}) == re2.strip("`")
    assert cel.compile(when).execute({"args": {"id": "123"}}) is True
    assert cel.compile(when).execute({"args": {"id": "12a"}}) is False
