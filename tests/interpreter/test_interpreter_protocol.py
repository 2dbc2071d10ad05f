"""Tests that a worker writing its own frames can do no more than a stub, and a broken one is killed."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import REAL_RUNS
from hostile_frames import PRELUDE

from proctor.errors import SandboxError
from proctor.interpreter import Interpreter
from proctor.testing import InMemoryAudit

BROKEN = {
    "bad_json": "raw(struct.pack('>I', 5) + b'{{{{{')",
    "oversized": "raw(struct.pack('>I', 2**31) + b'{\"t\":\"done\",' + b' ' * 400)",
    "oversized_call_not_closed": ("b = b'{\"t\":\"call\",\"id\":7,\"run\":RUN,\"tool\":\"lookup\",\"args\":' "
                                  "+ b'[' + b'1,' * 3000000 + b'1]x'\nraw(struct.pack('>I', len(b)) + b)"),
    "too_many_containers": ("b = json.dumps({'t': 'final', 'run': RUN, 'value': [[]] * 200000}).encode()\n"
                            "raw(struct.pack('>I', len(b)) + b)"),
    "not_an_object": "raw(struct.pack('>I', 5) + b'[1,2]')",
    "unknown_type": "msg({'t': 'hello'})",
    "reply_from_worker": "msg({'t': 'reply', 'id': 1, 'ok': True, 'value': 1})",
    "wrong_field_type": "msg({'t': 'call', 'id': 'x', 'run': RUN, 'tool': 'lookup', 'args': {}})",
    "unknown_tag": "msg({'t': 'call', 'id': 10**6, 'run': RUN, 'tool': 'lookup', 'args': {'$evil': 1}})",
    "ready_again": "msg({'t': 'ready', 'pid': 1})",
    "done_for_other_run": "msg({'t': 'done', 'run': RUN + 5, 'value': 1, 'error': None, 'final': True, 'cut': False})",
    "duplicate_id": ("m = {'t': 'call', 'id': 10**6, 'run': RUN, 'tool': 'lookup', 'args': {'order': 'dup'}}\n"
                     "msg(m)\nmsg(m)\nimport time\ntime.sleep(5)"),
    "deep_nesting": "b = b'[' * 100000 + b']' * 100000\nraw(struct.pack('>I', len(b)) + b)",
    # the protocol's state machine: messages that do not fit the run the host is driving
    "done_without_key": ("msg({'t': 'done', 'run': RUN, 'value': 'all good', 'error': None, 'final': True, "
                         "'cut': False})"),
    "done_with_wrong_key": ("msg({'t': 'done', 'run': RUN, 'value': 'all good', 'error': None, 'final': True, "
                            "'cut': False, 'key': '0' * 32})"),
    "call_for_earlier_run": "msg({'t': 'call', 'id': 10**6, 'run': RUN - 1, 'tool': 'lookup', 'args': {'order': 's'}})",
    "call_for_later_run": "msg({'t': 'call', 'id': 10**6, 'run': RUN + 1, 'tool': 'lookup', 'args': {'order': 's'}})",
    "final_for_other_run": "msg({'t': 'final', 'run': RUN + 1, 'value': 1})",
    "second_final": "msg({'t': 'final', 'run': RUN, 'value': 1})\nmsg({'t': 'final', 'run': RUN, 'value': 2})",
    "reply_shaped_error": "msg({'t': 'reply', 'id': 1, 'ok': False, 'error': {'type': 'ToolDenied', 'message': 'x'}})",
    "run_from_worker": "msg({'t': 'run', 'run': RUN, 'code': 'x'})",
}


@pytest.fixture
def forger(make: Callable[..., Interpreter]) -> Interpreter:
    # Process isolation with os authorized: the program is trusted test code that only writes frames.
    return make(sandbox="process", authorized_imports=["os", "stat", "struct", "json", "time"], timeout=5)


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_frames_kill_the_worker_not_the_host(forger: Interpreter, audit: InMemoryAudit, name: str) -> None:
    """Malformed, oversized or out-of-protocol frames: SandboxError, audited, state lost, the next run works."""
    forger.run("kept = 1")
    before = REAL_RUNS.copy()
    code = PRELUDE + BROKEN[name].replace("RUN", str(forger._seq + 1)) + "\nimport time\ntime.sleep(5)"
    r = forger.run(code)
    assert isinstance(r.error, SandboxError), r.error
    assert "protocol violation" in str(r.error) and r.state_lost
    assert r.value is None
    violations = audit.of_kind("protocol_violation")
    assert violations and violations[-1]["isolation"] == "process" and violations[-1]["run_id"]
    assert r.duration < 4
    after = forger.run("'kept' in dir()")
    assert after.error is None and after.value is False and after.state_lost
    dup_served = 1 if name == "duplicate_id" else 0
    assert REAL_RUNS["lookup"] - before["lookup"] == dup_served
    assert REAL_RUNS["wipe"] == 0


def test_forged_call_is_gated_like_a_stub_call(forger: Interpreter, audit: InMemoryAudit) -> None:
    """A hand-written call frame is just a request: a denied tool stays denied and is audited."""
    run = forger._seq + 1
    code = PRELUDE + (
        f"msg({{'t': 'call', 'id': 10**7, 'run': {run}, 'tool': 'wipe', 'args': {{'target': 'db'}}}})\n"
        f"msg({{'t': 'call', 'id': 10**7 + 1, 'run': {run}, 'tool': 'lookup', 'args': {{'order': 'forged'}}}})\n"
        f"msg({{'t': 'call', 'id': 10**7 + 2, 'run': {run}, 'tool': 'no_such_tool', 'args': {{}}}})\n"
        "lookup('real')")
    before = REAL_RUNS.copy()
    r = forger.run(code)
    assert r.error is None, r.error
    assert [(c.tool, c.status) for c in r.tool_calls] == [
        ("wipe", "denied"), ("lookup", "ok"), ("no_such_tool", "denied"), ("lookup", "ok")]
    assert REAL_RUNS["wipe"] == 0
    assert REAL_RUNS["lookup"] - before["lookup"] == 2  # 'forged' (gated, allowed) and 'real'
    outcomes = {(o["tool"], o["status"]) for o in audit.of_kind("call_outcome")}
    assert ("wipe", "denied") in outcomes
    assert forger.run("1").value == 1  # the worker survived: forged requests are not protocol errors


def test_seen_request_ids_stay_small_and_catch_reuse() -> None:
    """Request ids are remembered as a watermark plus the few out of order: reuse is caught, memory stays flat."""
    from proctor.interpreter.channel import ProtocolError
    from proctor.interpreter.host import SeenIds

    seen = SeenIds()
    for i in (1, 2, 4, 3, 6):
        assert i not in seen
        seen.add(i)
    assert all(i in seen for i in (1, 2, 3, 4, 6)) and 5 not in seen and 0 in seen
    assert seen.upto == 4 and seen.above == {6}
    for i in range(5, 100_000):
        if i != 6:
            seen.add(i)
    assert seen.upto == 99_999 and not seen.above
    with pytest.raises(ProtocolError, match="skip"):
        for i in range(200_000, 200_000 + 2 * (SeenIds.MAX_GAPS + 1), 2):
            seen.add(i)


def test_taking_a_request_id_refuses_every_reuse_in_order_or_not() -> None:
    """`SeenIds.take` (the per-call check) accepts each id once, in order or out of it, and refuses repeats."""
    from proctor.interpreter.host import SeenIds

    seen = SeenIds()
    assert [seen.take(i) for i in (1, 2, 4, 3, 4, 2, 5, 0, 7, 7, 6)] == [
        True, True, True, True, False, False, True, False, True, False, True]
    assert seen.upto == 7 and not seen.above
