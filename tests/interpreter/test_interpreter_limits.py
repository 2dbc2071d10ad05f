"""Hostile sizes from the program's side: huge arguments, huge or deep frames, frames sent at the deadline."""

from __future__ import annotations

import json
import struct
import tracemalloc
from collections.abc import Callable

import pytest
from conftest import ISOLATIONS, POLICY, REAL_RUNS, TOOLS, needs_bwrap
from hostile_frames import PRELUDE

from proctor.errors import ConfigurationError, ExecutionTimeout, SandboxError
from proctor.gate import Gate
from proctor.interpreter import Interpreter
from proctor.interpreter.limits import ChannelLimits, HostFrameReader, OversizedCall
from proctor.interpreter.messages import parse_worker_message
from proctor.policy import Policy
from proctor.testing import InMemoryAudit

STAR = [pytest.param("bwrap", marks=needs_bwrap), "process"]
MiB = 1024 * 1024

CATCH = ("def attempt(v):\n    try:\n        return lookup(v)\n    except ToolDenied as e:\n"
         "        return 'ToolDenied: ' + str(e)\n")


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _refusals(audit: InMemoryAudit) -> list[dict[str, object]]:
    return [i for i in audit.of_kind("call_intent") if i.get("args_bytes") is not None]


@pytest.mark.parametrize("sandbox", ISOLATIONS)
@pytest.mark.parametrize("size", [2 * MiB, 15_000_000])
def test_a_huge_argument_is_refused_by_its_size_and_audited_by_digest(
        make: Callable[..., Interpreter], audit: InMemoryAudit, sandbox: str, size: int) -> None:
    """15 MB (over the frame limit: streamed) and 2 MiB (buffered) arguments: refused naming size and limit."""
    py = make(sandbox=sandbox)
    before = REAL_RUNS["lookup"]
    r = py.run(CATCH + f"attempt('x' * {size})")
    assert r.error is None, r.error
    sent = size + len('{"order":""}')
    assert r.value.startswith("ToolDenied: lookup: refused: its arguments are")
    assert f"{sent:,} bytes" in r.value and "1,048,576 bytes (1 MiB)" in r.value and "max_arg_bytes" in r.value
    assert REAL_RUNS["lookup"] == before
    assert [(c.tool, c.status, c.args) for c in r.tool_calls] == [("lookup", "denied", {})]
    (intent,) = _refusals(audit)
    assert intent["args"] == {} and intent["args_bytes"] == sent
    assert str(intent["args_digest"]).startswith("hmac-sha256:")
    assert all(len(json.dumps(rec)) < 4000 for rec in audit.records)  # nothing of the payload was written
    assert py.run(CATCH + "attempt('y' * 1000)").value == "order " + "y" * 1000 + ": shipped"


def test_the_digest_identifies_the_payload(make: Callable[..., Interpreter], audit: InMemoryAudit) -> None:
    """The same oversized arguments give the same digest; different ones a different digest."""
    py = make(sandbox="process")
    py.run(CATCH + "attempt('a' * 2_000_000)\nattempt('a' * 2_000_000)\nattempt('b' * 2_000_000)")
    digests = [i["args_digest"] for i in _refusals(audit)]
    assert len(digests) == 3 and digests[0] == digests[1] != digests[2]


def test_host_memory_stays_flat_under_repeated_huge_arguments(make: Callable[..., Interpreter],
                                                               audit: InMemoryAudit) -> None:
    """The issue's case: 8 calls with a 15 MB string, run 6 times: the host grows by far less than one string."""
    py = make(sandbox="process", memory_limit=1024 * MiB)
    code = CATCH + "big = 'x' * 15_000_000\n[attempt(big) for _ in range(8)]"
    py.run(code)
    start = _rss_mib()
    for _ in range(5):
        r = py.run(code)
        assert r.error is None and all(v.startswith("ToolDenied") for v in r.value)
    assert _rss_mib() - start < 15
    assert len(_refusals(audit)) == 48


def test_a_tool_limit_in_the_policy_overrides_the_default(audit: InMemoryAudit) -> None:
    """`tools: lookup: {max_arg_bytes: 200}` refuses 300 bytes; `8MiB` for charge lets 6 MB through."""
    policy = dict(POLICY, tools={"lookup": {"max_arg_bytes": 200}, "slow": {"max_arg_bytes": "8MiB"}})
    gate = Gate(Policy.from_dict(policy), audit=audit, tools=TOOLS)
    with Interpreter(TOOLS, gate, sandbox="process", timeout=20) as py:
        r = py.run(CATCH + "[attempt('z' * 100), attempt('z' * 300)]")
        assert r.value[0].endswith(": shipped")
        assert "the policy's tools.lookup.max_arg_bytes" in r.value[1] and "200 bytes" in r.value[1]
        r = py.run("try:\n    slow(float('0' * 6_000_000 + '1e-9'))\nexcept Exception as e:\n    err = str(e)\n"
                   "else:\n    err = None\nerr")
        assert r.error is None and r.value is None, r.value  # under 8 MiB: decoded, validated, run
        assert py.channel_limits.max_frame_bytes >= 8 * MiB


def test_a_run_wide_limit_on_argument_bytes(make: Callable[..., Interpreter], audit: InMemoryAudit) -> None:
    """max_run_arg_bytes counts every call of the gate's run: past it, calls are refused naming it."""
    py = make(sandbox="process", max_run_arg_bytes=5000)
    r = py.run(CATCH + "[attempt('w' * 2000) for _ in range(3)]")
    assert [v.endswith(": shipped") for v in r.value] == [True, True, False]
    assert "max_run_arg_bytes" in r.value[2] and "5,000 bytes" in r.value[2]
    r = py.run(CATCH + "attempt('w' * 2000)")  # still the same run: still refused
    assert r.value.startswith("ToolDenied") and _refusals(audit)[-1]["args_bytes"] == 2012
    r = py.run(CATCH + "attempt('w' * 2000)", context=py.gate.start_run())  # a new run starts from zero
    assert r.value.endswith(": shipped")


@pytest.mark.parametrize("sandbox", ISOLATIONS)
def test_many_containers_are_refused_before_decoding(make: Callable[..., Interpreter], sandbox: str) -> None:
    """Lists of lists over the size limit, over the container limit, values over the value limit: refused."""
    py = make(sandbox=sandbox, timeout=30)
    r = py.run(CATCH + "[attempt([[]] * 400_000), attempt([[]] * 150_000), attempt([0] * 300_000)]")
    assert r.error is None, r.error
    big, many, values = r.value
    assert "max_arg_bytes" in big
    # the list, its items and the arguments' dict
    assert "150,002 lists, dicts, tuples and sets" in many and "max_containers" in many
    assert "max_values" in values
    assert [c.status for c in r.tool_calls] == ["denied"] * 3


def test_nesting_deeper_than_the_limit_is_refused_at_the_call_site(make: Callable[..., Interpreter]) -> None:
    """A value nested past max_depth never leaves the worker: a TypeError where the program called."""
    py = make(sandbox="process", max_depth=10)
    r = py.run("v = 'x'\nfor _ in range(12):\n    v = [v]\ntry:\n    lookup(v)\nexcept TypeError as e:\n"
               "    err = str(e)\nerr")
    assert "nested more than 10 levels" in r.value


def test_values_the_host_would_refuse_are_not_sent_as_results(make: Callable[..., Interpreter]) -> None:
    """A program whose result is over the limits gets a placeholder, and keeps its worker."""
    py = make(sandbox="process")
    r = py.run("kept = 1\n[[i] for i in range(200_000)]")
    assert r.error is None and not r.state_lost
    assert isinstance(r.value, str) and r.value.startswith("<value not sendable")
    r = py.run("final_answer('x' * (5 * 1024 * 1024))")
    assert r.is_final_answer and r.value.startswith("<value not sendable")
    assert py.run("kept").value == 1


@pytest.mark.parametrize("sandbox", STAR)
@pytest.mark.parametrize("how", ["trickle", "big_at_deadline", "header_only", "huge_call_at_deadline"])
def test_the_deadline_holds_while_a_frame_is_read(make: Callable[..., Interpreter], sandbox: str, how: str) -> None:
    """A frame trickled in, one sent just before the deadline, a lone header: the run ends at its deadline."""
    timeout = 1.0
    py = make(sandbox=sandbox, authorized_imports=["*"], timeout=timeout)
    prelude = PRELUDE + "import time\nt0 = time.monotonic()\n"
    body = {
        "trickle": "os.write(fd, struct.pack('>I', 4_000_000))\nwhile True:\n    os.write(fd, b' ')\n"
                   "    time.sleep(0.001)",
        "big_at_deadline": f"b = json.dumps({{'t': 'final', 'run': {py._seq + 1}, 'value': ['ab'] * 240_000}})"
                           f".encode()\ntime.sleep(max(0, {timeout} - 0.05 - (time.monotonic() - t0)))\n"
                           "os.write(fd, struct.pack('>I', len(b)) + b)\ntime.sleep(30)",
        "header_only": "os.write(fd, struct.pack('>I', 3_000_000))\ntime.sleep(30)",
        "huge_call_at_deadline": f"b = b'{{\"t\":\"call\",\"id\":9,\"run\":{py._seq + 1},\"tool\":\"lookup\","
                                 f"\"args\":{{\"order\":\"' + b'q' * 60_000_000 + b'\"}}}}'\n"
                                 f"time.sleep(max(0, {timeout} - 0.05 - (time.monotonic() - t0)))\n"
                                 "os.write(fd, struct.pack('>I', len(b)) + b)\ntime.sleep(30)",
    }[how]
    r = py.run(prelude + body)
    assert isinstance(r.error, (ExecutionTimeout, SandboxError)) or r.is_final_answer, r.error
    # The deadline plus a generous margin for a loaded machine (bench/interpreter.py measures the overshoot).
    assert r.duration < timeout + 0.6, r.duration
    assert py.run("6 * 7").value == 42


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize("name, body", [
    ("short strings", b'{"t":"final","run":1,"value":[' + b",".join([b'"ab"'] * 249_000) + b"]}"),
    ("floats", b'{"t":"final","run":1,"value":[' + b",".join([b"0.5"] * 249_000) + b"]}"),
    ("empty lists", b'{"t":"final","run":1,"value":[' + b",".join([b"[]"] * 99_000) + b"]}"),
    ("one string", b'{"t":"final","run":1,"value":"' + b"a" * (4 * MiB - 40) + b'"}'),
    ("call over its limit", b'{"t":"call","id":1,"run":1,"tool":"lookup","args":{"o":"' + b"a" * (3 * MiB) + b'"}}'),
    ("call over the frame", b'{"t":"call","id":1,"run":1,"tool":"lookup","args":{"o":"' + b"a" * (40 * MiB) + b'"}}'),
    ("the issue's 4M lists", b'{"t":"call","id":1,"run":1,"tool":"lookup","args":{"o":[' + b"[]," * 4_000_000
     + b"[]]}}"),
])
def test_host_memory_for_one_hostile_frame_is_a_small_multiple_of_the_limit(name: str, body: bytes) -> None:
    """The worst frames within the limits cost the host at most 5x the 4 MiB frame limit, as they are decoded."""
    limits = ChannelLimits()
    data = _frame(body)
    reader = HostFrameReader(limits)
    tracemalloc.start()
    try:
        out = []
        for i in range(0, len(data), 1 << 16):
            out += reader.feed(data[i : i + (1 << 16)])
        messages = [m if isinstance(m, OversizedCall) else parse_worker_message(m) for _, m in out]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(messages) == 1
    assert peak < 5 * limits.max_frame_bytes, f"{name}: {peak / MiB:.1f} MiB"


def test_limits_are_checked_when_the_interpreter_is_built(gate: Gate) -> None:
    """A zero or negative limit is a configuration error naming the setting."""
    with pytest.raises(ConfigurationError, match="max_containers"):
        Interpreter(TOOLS, gate, sandbox="process", max_containers=0)
    with pytest.raises(ConfigurationError, match="max_depth"):
        Interpreter(TOOLS, gate, sandbox="process", max_depth=1000)


@pytest.mark.parametrize("sandbox", ISOLATIONS)
def test_argument_limits_hold_to_the_byte(make: Callable[..., Interpreter], audit: InMemoryAudit, sandbox: str) -> None:
    """Arguments of exactly max_arg_bytes pass, one byte more is refused; a run may reach max_run_arg_bytes exactly."""
    py = make(sandbox=sandbox, max_arg_bytes=200, max_run_arg_bytes=600)
    # {"order":"…"} is 12 bytes around the string; é is 6 bytes as the program sends it (\u00e9: ASCII JSON).
    r = py.run(CATCH + "[attempt('z' * 188), attempt('z' * 189), attempt('é' * 31 + 'zz'), attempt('é' * 31 + 'zzz')]")
    assert [v.endswith(": shipped") for v in r.value] == [True, False, True, False], r.value
    assert "max_arg_bytes" in r.value[1] and "200 bytes" in r.value[1]
    assert [e["args_bytes"] for e in _refusals(audit)[-2:]] == [201, 201]
    r = py.run(CATCH + "attempt('y' * 188)")  # 200 + 200 + 200 = 600 bytes this run: still within it
    assert r.value.endswith(": shipped"), r.value
    r = py.run(CATCH + "attempt('')")  # 612: past the run's limit
    assert r.value.startswith("ToolDenied") and "max_run_arg_bytes" in r.value
