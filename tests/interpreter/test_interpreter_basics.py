"""Tests for Interpreter: persistence, values, errors, logs, final_answer, refusals at the call site."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REAL_RUNS

from proctor.errors import ExecutionTimeout, SandboxError
from proctor.interpreter import ExecutionResult, Interpreter, ProgramError
from proctor.testing import InMemoryAudit


def test_variables_persist_between_runs_and_last_expression_is_the_value(py: Interpreter) -> None:
    """A variable set in one run is there in the next, and the last expression is `value`."""
    assert py.run("x = 20").error is None
    r = py.run("x += 1\nx * 2")
    assert r.error is None and r.value == 42 and not r.is_final_answer


def test_reset_gives_a_clean_worker(py: Interpreter) -> None:
    """After reset() the old variable is gone (smolagents experiment 1)."""
    py.run("secret_value = 'kept'")
    py.reset()
    r = py.run("secret_value")
    assert isinstance(r.error, ProgramError) and r.error.type == "NameError"
    assert "secret_value" in str(r.error)


def test_error_carries_line_and_keeps_logs(py: Interpreter) -> None:
    """An exception names its type, message and line; what was printed before it is kept."""
    r = py.run("print('before')\ny = 1\nz = y / 0\nprint('after')")
    assert str(r.error) == "ZeroDivisionError: division by zero (line 3: z = y / 0)"
    assert r.logs == "before\n"


def test_syntax_error_is_reported_with_its_line(py: Interpreter) -> None:
    """A program that does not parse is an error with its line, not a crash."""
    r = py.run("x = 1\nif x\n    pass")
    assert isinstance(r.error, ProgramError) and r.error.type == "SyntaxError" and r.error.line == 2


def test_output_beyond_max_output_is_cut_with_a_marker(make: Callable[..., Interpreter]) -> None:
    """Output past max_output is dropped and the logs say so."""
    py = make(sandbox="process", max_output=1000)
    r = py.run("for i in range(5000):\n    print('line', i)")
    assert r.error is None
    assert r.logs.startswith("line 0\nline 1\n")
    assert r.logs.endswith("[output truncated: more than 1000 characters]")
    assert len(r.logs) < 1100


def test_final_answer_ends_the_program(py: Interpreter) -> None:
    """final_answer(x) stops the program and gives x as the value."""
    r = py.run("final_answer({'a': (1, 2)})\nprint('not reached')")
    assert r.is_final_answer and r.value == {"a": (1, 2)} and r.logs == "" and r.error is None


@pytest.mark.parametrize("handler", ["except Exception:", "except BaseException:", "except:"])
def test_final_answer_cannot_be_swallowed(py: Interpreter, handler: str) -> None:
    """Catching final_answer's exception does not undo it, and later tool calls are refused."""
    before = REAL_RUNS["lookup"]
    code = f"try:\n    final_answer('done')\n{handler}\n    pass\nlookup('after')\n'other'"
    r = py.run(code)
    assert r.is_final_answer and r.value == "done"
    assert REAL_RUNS["lookup"] == before


def test_denied_call_raises_at_the_call_site_and_can_be_handled(py: Interpreter) -> None:
    """A policy denial raises ToolDenied inside the program, where the model can catch it."""
    code = ("try:\n    wipe('db')\nexcept ToolDenied as e:\n    print('denied:', e)\n"
            "from proctor.errors import CallRefused\nissubclass(ToolDenied, CallRefused)")
    r = py.run(code)
    assert r.error is None and r.value is True
    assert "denied:" in r.logs and "never wipe" in r.logs
    assert [c.status for c in r.tool_calls] == ["denied"]
    assert REAL_RUNS["wipe"] == 0


def test_budget_exceeded_raises_the_same_named_exception(py: Interpreter) -> None:
    """The second charge passes the one-charge budget: BudgetExceeded at the call site, with the budget's name."""
    r = py.run("charge(1)\ntry:\n    charge(2)\nexcept BudgetExceeded as e:\n    print(type(e).__name__, e.budget)")
    assert r.error is None and r.logs == "BudgetExceeded one-charge\n"
    assert [c.status for c in r.tool_calls] == ["ok", "denied"]


def test_uncaught_refusal_is_the_program_error(py: Interpreter) -> None:
    """An uncaught ToolDenied ends the program with its type and line."""
    r = py.run("x = 1\nwipe('all')")
    assert isinstance(r.error, ProgramError) and r.error.type == "ToolDenied" and r.error.line == 2


def test_charge_then_crash_still_lists_the_charge(py: Interpreter, audit: InMemoryAudit) -> None:
    """After `charge(); 1/0` the charge is in the result and the audit log (smolagents experiment 2)."""
    r = py.run("charge()\n1/0")
    assert isinstance(r.error, ProgramError) and r.error.type == "ZeroDivisionError"
    assert [(c.tool, c.status) for c in r.tool_calls] == [("charge", "ok")]
    outcomes = [o for o in audit.of_kind("call_outcome") if o["tool"] == "charge"]
    assert [o["status"] for o in outcomes] == ["ok"]


def test_tool_values_round_trip_with_tags(py: Interpreter) -> None:
    """bytes, tuples, sets, non-string keys and tag-like keys survive the channel both ways."""
    r = py.run("v = blob('mixed')\n(v['bytes'], v['tuple'], v['set'], v['$tuple'], v[1], type(v['tuple']).__name__)")
    assert r.error is None
    assert r.value == (b"\x00\xff", (1, 2), {3}, "escaped", "int key", "tuple")


def test_unencodable_tool_result_is_a_clear_error(py: Interpreter) -> None:
    """A tool result that cannot cross the channel raises ToolFailed naming the type."""
    r = py.run("blob('object')")
    assert isinstance(r.error, ProgramError) and r.error.type == "ToolFailed" and "object" in str(r.error)


def test_unencodable_argument_is_a_type_error_at_the_call_site(py: Interpreter) -> None:
    """Passing an object the channel cannot carry fails in the program, before any request."""
    r = py.run("class A: pass\nlookup(A())")
    assert isinstance(r.error, ProgramError) and r.error.type == "TypeError" and r.error.line == 2
    assert r.tool_calls == ()


def test_stub_has_the_tool_signature_and_docstring(py: Interpreter) -> None:
    """A stub binds arguments like the real function, and documents itself like it."""
    r = py.run("print(lookup.__doc__)\nlookup(order='a1')\ntry:\n    lookup('a', 'b')\nexcept TypeError as e:\n"
               "    print('TypeError', e)")
    assert r.error is None and "Look an order up." in r.logs and "order: Order id." in r.logs
    assert "TypeError" in r.logs and "positional argument" in r.logs
    assert [c.args for c in r.tool_calls] == [{"order": "a1"}]


def test_unencodable_program_value_comes_back_as_its_repr(py: Interpreter) -> None:
    """The last expression's value is returned as data, or its repr when it is not data."""
    r = py.run("class Point:\n    def __repr__(self):\n        return 'Point()'\nPoint()")
    assert r.error is None and r.value == "Point()"


def test_import_outside_the_allow_list_names_what_is_allowed(py: Interpreter) -> None:
    """A refused import says which modules are allowed."""
    r = py.run("import math, collections\nimport os")
    assert isinstance(r.error, ProgramError) and r.error.type == "ImportError" and r.error.line == 2
    assert "'os' is not allowed" in str(r.error) and "math" in str(r.error)


def test_authorized_imports_with_package_wildcard(make: Callable[..., Interpreter]) -> None:
    """`pkg.*` allows a package and its submodules; the defaults stay allowed."""
    py = make(sandbox="process", authorized_imports=["json", "email.*"])
    r = py.run("import json, email.mime.text, math\njson.dumps([math.pi > 3])")
    assert r.error is None and r.value == "[true]"
    assert py.run("import xml").error is not None


def test_timeout_preempts_and_the_state_is_lost(py: Interpreter) -> None:
    """0.2 s timeout on `time.sleep(1.2); y = 7`: back long before the sleep would end, y never set (experiment 3)."""
    py.timeout = 0.2
    py.run("import time")
    r = py.run("time.sleep(1.2)\ny = 7")
    assert r.duration < 0.8  # preempted; the overshoot itself is measured in bench/interpreter.py, not here
    assert isinstance(r.error, ExecutionTimeout) and r.state_lost
    py.timeout = 10
    after = py.run("y")
    assert after.state_lost and isinstance(after.error, ProgramError) and after.error.type == "NameError"


def test_time_waiting_on_the_host_does_not_count(make: Callable[..., Interpreter]) -> None:
    """A tool that takes longer than the timeout on the host does not time the program out."""
    py = make(sandbox="process", timeout=0.5)
    r = py.run("slow(0.8)")
    assert r.error is None and r.value == "slept"


def test_closed_interpreter_refuses_to_run(make: Callable[..., Interpreter]) -> None:
    """run() after close() raises SandboxError instead of starting anything."""
    py = make(sandbox="process")
    py.close()
    with pytest.raises(SandboxError):
        py.run("1")


def test_result_is_a_plain_dataclass(py: Interpreter) -> None:
    """ExecutionResult carries the documented fields."""
    r = py.run("1")
    assert isinstance(r, ExecutionResult)
    assert (r.value, r.logs, r.error, tuple(r.tool_calls), r.is_final_answer) == (1, "", None, (), False)


def test_logs_printed_before_a_timeout_are_kept(make: Callable[..., Interpreter]) -> None:
    """What the program printed before it was killed at the deadline is in the result."""
    py = make(sandbox="process", timeout=0.5)
    r = py.run("import time\nprint('started')\nprint('working', end='')\nprint()\ntime.sleep(5)")
    assert isinstance(r.error, ExecutionTimeout) and r.logs == "started\nworking\n"


def test_final_answer_then_running_on_is_stopped_but_answered(make: Callable[..., Interpreter]) -> None:
    """A program that swallows final_answer and keeps running is stopped; the answer stands."""
    py = make(sandbox="process", timeout=5)
    r = py.run("try:\n    final_answer(7)\nexcept BaseException:\n    pass\nwhile True:\n    pass")
    assert r.is_final_answer and r.value == 7 and r.error is None and r.state_lost
    assert r.duration < 3


def test_gate_that_raises_refuses_the_call(py: Interpreter, monkeypatch: pytest.MonkeyPatch) -> None:
    """If gate.submit ever raised, the call is refused in the program and the host goes on."""
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(py.gate, "submit", broken)
    r = py.run("try:\n    lookup('a')\nexcept ToolDenied as e:\n    print(e)")
    assert r.error is None and "the gate failed" in r.logs and [c.status for c in r.tool_calls] == ["denied"]


def test_non_ascii_and_lone_surrogates_cross_the_channel(py: Interpreter) -> None:
    """Unicode, including strings with lone surrogates, survives both directions."""
    r = py.run("s = 'héllo ☃ \\udcff'\nprint(lookup('héllo ☃'))\ns")
    assert r.error is None and r.logs == "order héllo ☃: shipped\n" and r.value == "héllo ☃ \udcff"


def test_reserved_tool_names_are_refused(gate: object) -> None:
    """A tool that would shadow final_answer cannot be given to an interpreter."""
    from proctor.tools import tool

    @tool(name="final_answer", side_effect="read")
    def fa(x: str) -> str:
        """Shadow.

        Args:
            x: Anything.
        """
        return x

    with pytest.raises(ValueError, match="final_answer"):
        Interpreter([fa], gate, sandbox="process")


def test_waiting_for_a_human_does_not_count_and_denial_raises(audit: InMemoryAudit,
                                                              make: Callable[..., Interpreter]) -> None:
    """A slow approval does not time the program out; a refused one raises ApprovalDenied at the call site."""
    import time as _time

    from conftest import POLICY, TOOLS

    from proctor.approval import CallbackApprover
    from proctor.gate import Gate
    from proctor.policy import Policy

    answers = iter([True, False])

    def human(request: object) -> bool:
        _time.sleep(0.6)
        return next(answers)

    ask = {"name": "ask", "match": {"tool": "charge"}, "decision": "require_approval"}
    policy = dict(POLICY, budgets=[], rules=[ask])
    gate = Gate(Policy.from_dict(policy), approver=CallbackApprover(human), audit=audit, tools=TOOLS)
    py = make(gate=gate, sandbox="process", timeout=0.4)
    r = py.run("print(charge(1))\ntry:\n    charge(2)\nexcept ApprovalDenied as e:\n    print('no:', e)")
    assert r.error is None, r.error
    assert r.logs.startswith("charged 1\nno: ")
    assert [c.status for c in r.tool_calls] == ["ok", "denied"]


def test_flood_of_refused_requests_cannot_stop_the_clock(make: Callable[..., Interpreter]) -> None:
    """Refused calls take the program's own time: a loop of denied calls still times out."""
    py = make(sandbox="process", timeout=0.5)
    r = py.run("while True:\n    try:\n        wipe('x')\n    except ToolDenied:\n        pass")
    assert isinstance(r.error, ExecutionTimeout) and r.duration < 1.5


def test_huge_values_do_not_break_the_worker(py: Interpreter) -> None:
    """A value JSON cannot carry is reported as such; the worker and its variables survive."""
    py.run("keep = 1")
    r = py.run("10 ** 5000")
    assert r.error is None and isinstance(r.value, str) and "not sendable" in r.value
    r = py.run("lookup(10 ** 5000)")
    assert isinstance(r.error, ProgramError) and r.error.type == "EncodeError"
    assert py.run("keep").value == 1


def test_stub_keeps_keyword_only_and_defaults(make: Callable[..., Interpreter]) -> None:
    """Stubs bind like the real signature: keyword-only parameters and default values."""
    from proctor.tools import tool

    seen: list[dict[str, object]] = []

    @tool(side_effect="read")
    def shaped(a: int, b: str = "x", *, c: bool = False, d: tuple[int, int] = (1, 2)) -> str:
        """Take arguments of every kind.

        Args:
            a: A number.
            b: Either way.
            c: Keyword only.
            d: A tuple default.
        """
        seen.append({"a": a, "b": b, "c": c, "d": d})
        return "ok"

    py = make(tools=[shaped], sandbox="process")
    r = py.run("shaped(1)\nshaped(2, 'y', c=True)\ntry:\n    shaped(3, 'z', True)\nexcept TypeError as e:\n"
               "    print(e)\nprint(shaped.__annotations__['a'])")
    assert r.error is None, r.error
    assert "positional arguments" in r.logs and r.logs.endswith("int\n")
    assert seen == [{"a": 1, "b": "x", "c": False, "d": (1, 2)}, {"a": 2, "b": "y", "c": True, "d": (1, 2)}]


def test_late_thread_calling_final_answer_does_not_break_the_next_run(make: Callable[..., Interpreter]) -> None:
    """A thread that answers after its program ended changes nothing; the worker and its variables stay."""
    py = make(sandbox="process", authorized_imports=["threading", "time"])
    r = py.run("import threading, time\nkeep = 3\n"
               "threading.Thread(target=lambda: (time.sleep(0.2), final_answer('late'))).start()\n'now'")
    assert r.value == "now" and not r.is_final_answer
    import time as _time

    _time.sleep(0.4)
    after = py.run("keep")
    assert after.error is None and after.value == 3 and not after.is_final_answer and not after.state_lost


def test_the_run_an_interpreter_started_itself_is_finished_when_it_closes(tmp_path: Path) -> None:
    """README's ten lines (`with Interpreter(tools, gate=gate)` and no context) left a `run_started` that never
    finished: `proctor audit verify` said the writer was killed or crashed, and `--strict` failed a clean exit.
    A run given as `context=` belongs to its caller and is left open."""
    from conftest import POLICY, TOOLS

    from proctor.audit import AuditLog, verify
    from proctor.gate import Gate
    from proctor.policy import Policy

    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as log:
        gate = Gate(Policy.from_dict(POLICY), audit=log, tools=TOOLS)
        with Interpreter(TOOLS, gate, timeout=10, sandbox="process") as py:
            assert py.run("lookup('1')").error is None
            assert py.run("lookup('2')").error is None
        given = gate.start_run(principal="alice")
        with Interpreter(TOOLS, gate, timeout=10, sandbox="process", context=given) as py:
            assert py.run("lookup('3')").error is None
        py.close()  # closing again finishes nothing twice
    records = [json.loads(line) for line in path.read_text().splitlines()]
    started = [r["run_id"] for r in records if r["kind"] == "run_started"]
    finished = [r for r in records if r["kind"] == "run_finished"]
    assert len(started) == 2 and [(f["run_id"], f["status"], f["calls"]["ok"]) for f in finished] == [
        (started[0], "done", 2)]
    report = verify(path)
    assert report.ok and report.unfinished_runs == [given.info.id]


@pytest.mark.parametrize(("raised", "status"), [(RuntimeError, "error"), (KeyboardInterrupt, "interrupted")])
def test_a_with_block_left_by_an_exception_does_not_finish_the_interpreters_run_as_done(
        tmp_path: Path, raised: type[BaseException], status: str) -> None:
    """The run an Interpreter started itself ends as its `with` block did: Ctrl-C (or an error) in the caller's
    code between two programs is not a run that ended `done`."""
    from conftest import POLICY, TOOLS

    from proctor.audit import AuditLog
    from proctor.gate import Gate
    from proctor.policy import Policy

    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as log:
        gate = Gate(Policy.from_dict(POLICY), audit=log, tools=TOOLS)
        with pytest.raises(raised), Interpreter(TOOLS, gate, timeout=10, sandbox="process") as py:
            assert py.run("lookup('1')").error is None
            raise raised("stopped")
    finished = [r for r in (json.loads(line) for line in path.read_text().splitlines()) if r["kind"] == "run_finished"]
    assert [(f["status"], f["calls"]["ok"]) for f in finished] == [(status, 1)]
