"""Each call reaches the gate with where the program made it: the innermost call expression in the
program's own text, however the tool was reached (an alias, a comprehension, a `sorted` key, `map`, a helper
the program defined, a call over two lines); a worker's report pointing outside the program marks nothing."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import ISOLATIONS, POLICY, TOOLS
from hostile_frames import PRELUDE

from proctor.approval.base import ApprovalRequest
from proctor.approval.callback import CallbackApprover
from proctor.calls import CallPosition, source_lines
from proctor.errors import SandboxError
from proctor.gate import Gate
from proctor.interpreter import Interpreter
from proctor.policy import Policy
from proctor.testing import InMemoryAudit

ASKING = {**POLICY, "rules": [{"name": "ask", "match": {"tool": "lookup"}, "decision": "require_approval"}]}

PROGRAM = """f = lookup
a = lookup('A1')
b = [f(o) for o in ['B1']]
c = sorted(['C1'], key=lambda o: lookup(o))
d = list(map(lookup, ['D1']))
def helper(o):
    return lookup(o)
e = helper('E1')
g = lookup(
    'G1')
s = 'x\u2028y'; h = lookup('H1')
"""


def asking(asked: list[ApprovalRequest]) -> Gate:
    def answer(request: ApprovalRequest) -> bool:
        asked.append(request)
        return True

    return Gate(Policy.from_dict(ASKING), approver=CallbackApprover(answer), audit=InMemoryAudit(), tools=TOOLS)


def text_at(code: str, at: CallPosition) -> str:
    lines = [line.encode() for line in source_lines(code)]
    assert at.col is not None and at.end_line is not None and at.end_col is not None
    if at.line == at.end_line:
        return lines[at.line - 1][at.col:at.end_col].decode()
    inner = [lines[at.line - 1][at.col:], *lines[at.line:at.end_line - 1], lines[at.end_line - 1][:at.end_col]]
    return b"\n".join(inner).decode()


@pytest.mark.parametrize("sandbox", ISOLATIONS)
def test_every_call_is_placed_at_its_own_call_expression(make: Callable[..., Interpreter], sandbox: str) -> None:
    asked: list[ApprovalRequest] = []
    py = make(gate=asking(asked), sandbox=sandbox)
    r = py.run(PROGRAM)
    assert r.error is None, r.error
    placed = [(req.args["order"], req.position) for req in asked]
    assert [order for order, _ in placed] == ["A1", "B1", "C1", "D1", "E1", "G1", "H1"]
    texts = {order: text_at(PROGRAM, at) for order, at in placed if at is not None}
    assert {order: at.line for order, at in placed if at is not None} == {
        "A1": 2, "B1": 3, "C1": 4, "D1": 5, "E1": 7, "G1": 9, "H1": 11}
    assert texts == {
        "A1": "lookup('A1')",
        "B1": "f(o)",  # through the alias, inside the comprehension
        "C1": "lookup(o)",  # inside the sort key
        "D1": "list(map(lookup, ['D1']))",  # map calls the tool from C: the program's call that drove it
        "E1": "lookup(o)",  # the helper's body, not the line calling the helper
        "G1": "lookup(\n    'G1')",  # a call over two lines: from its first line to its last
        "H1": "lookup('H1')",  # after a U+2028 inside a string: the same line, as Python counts lines
    }


def test_a_position_outside_the_program_marks_nothing(make: Callable[..., Interpreter]) -> None:
    """The worker's report is a claim the host checks: a line or column beyond the program is dropped (the
    call is still gated), and a malformed position is a protocol violation."""
    asked: list[ApprovalRequest] = []
    py = make(gate=asking(asked), sandbox="process", authorized_imports=["os", "stat", "struct", "json", "time"])
    run = py._seq + 1
    code = PRELUDE + (
        f"msg({{'t': 'call', 'id': 10**7, 'run': {run}, 'tool': 'lookup', 'at': '999:0:999:4', "
        "'args': {'order': 'far'}})\n"
        f"msg({{'t': 'call', 'id': 10**7 + 1, 'run': {run}, 'tool': 'lookup', 'at': '1:400:1:401', "
        "'args': {'order': 'wide'}})\n"
        "import time\ntime.sleep(1)\n")
    r = py.run(code)
    assert r.error is None, r.error
    assert [(req.args["order"], req.position) for req in asked] == [("far", None), ("wide", None)]
    bad = py.run(PRELUDE + f"msg({{'t': 'call', 'id': 10**7 + 2, 'run': {py._seq + 1}, 'tool': 'lookup', "
                           "'at': '3:9:2:0', 'args': {'order': 'backwards'}})\nimport time\ntime.sleep(5)\n")
    assert isinstance(bad.error, SandboxError) and "malformed position" in str(bad.error)


def test_positions_parse_only_as_the_worker_writes_them() -> None:
    assert CallPosition.parse("3:8:3:49") == CallPosition(3, 8, 3, 49)
    assert CallPosition.parse("12") == CallPosition(12)
    for text in ("", "0", "03:8:3:49", "3:8:3", "3:8:2:0", "3:-1:3:4", "3:8:3:49:1", "٣:8:3:49", "1" * 10):
        assert CallPosition.parse(text) is None, text
    assert CallPosition(3, 8, 3, 49).text() == "3:8:3:49" and CallPosition(12).text() == "12"
