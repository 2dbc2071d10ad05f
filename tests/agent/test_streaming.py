"""`agent.run(task, stream=True)`: steps and calls arrive as they happen, then the same result as a plain run."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from proctor.agent import CallEvent, CodeAgent, RunResult, ScriptedModel, StepRecord, ToolCallingAgent
from proctor.agent.models import Message, ModelResponse
from proctor.policy import Policy
from proctor.tools import tool

from .conftest import TOOLS, program

WAIT = 120  # seconds: generous, the machine is shared; a pass never waits this long

STEP_1 = program('print(get_price("apple"))\ndelete_item("fig")')  # the denial ends the program
STEP_2 = program('final_answer(get_price("plum"))')


def _plain_and_streamed(policy: Policy, responses: Sequence[str]) -> tuple[RunResult, list[Any]]:
    with CodeAgent(TOOLS, ScriptedModel(responses), policy, sandbox="auto") as agent:
        plain = agent.run("Price some fruit.")
    with CodeAgent(TOOLS, ScriptedModel(responses), policy, sandbox="auto") as agent:
        items = list(agent.run("Price some fruit.", stream=True))
    return plain, items


def test_stream_yields_calls_then_steps_then_the_same_result(policy: Policy) -> None:
    """Each step's calls come before the step, steps in order, and the last item equals a plain run's result."""
    plain, items = _plain_and_streamed(policy, [STEP_1, STEP_2])
    result = items[-1]
    assert isinstance(result, RunResult)
    assert not any(isinstance(i, RunResult) for i in items[:-1])
    assert (result.status, result.answer) == (plain.status, plain.answer) == ("done", 0.5)
    assert [type(i).__name__ for i in items[:-1]] == ["CallEvent"] * 2 + ["StepRecord"] + ["CallEvent", "StepRecord"]
    steps = [i for i in items if isinstance(i, StepRecord)]
    assert steps == result.steps and [s.number for s in steps] == [1, 2]
    events = [i for i in items if isinstance(i, CallEvent)]
    assert [(e.step, e.call.tool) for e in events] == [(1, "get_price"), (1, "delete_item"), (2, "get_price")]
    assert [e.call.call_id for e in events] == [c.call_id for c in result.tool_calls]


def test_a_refused_call_is_a_refused_call_event(policy: Policy) -> None:
    """The policy's denial of delete_item arrives as a CallEvent marked refused, with its decision."""
    _, items = _plain_and_streamed(policy, [STEP_1, STEP_2])
    events = [i for i in items if isinstance(i, CallEvent)]
    refused = [e for e in events if e.refused]
    assert [e.call.tool for e in refused] == ["delete_item"]
    call = refused[0].call
    assert call.status == "denied" and call.decision is not None and call.decision.outcome == "deny"
    assert "nothing is deleted" in (call.error or "")
    assert not any(e.refused for e in events if e.call.tool == "get_price")


def test_steps_arrive_before_the_run_ends(policy: Policy) -> None:
    """The model's second answer waits until the caller has received step 1: the step was streamed, not batched."""
    seen_step_1 = threading.Event()

    def second(_messages: Sequence[Message]) -> str:
        assert seen_step_1.wait(WAIT), "step 1 was not streamed before step 2 began"
        return STEP_2

    with CodeAgent(TOOLS, ScriptedModel([STEP_1, second]), policy, sandbox="process") as agent:
        items: list[Any] = []
        for item in agent.run("Price some fruit.", stream=True):
            items.append(item)
            if isinstance(item, StepRecord) and item.number == 1:
                seen_step_1.set()
    assert isinstance(items[-1], RunResult) and items[-1].status == "done", items[-1]


def test_calls_are_yielded_as_decided_inside_a_running_program(policy: Policy) -> None:
    """A tool waits until the caller has the previous call's event: calls stream while the program still runs."""
    seen_first = threading.Event()

    @tool(side_effect="read")
    def wait_for_ui() -> bool:
        """Returns once the caller has seen the first call."""
        return seen_first.wait(WAIT)

    code = program('a = get_price("apple")\nfinal_answer(wait_for_ui())')
    with CodeAgent([*TOOLS, wait_for_ui], ScriptedModel([code]), policy, sandbox="process") as agent:
        items: list[Any] = []
        for item in agent.run("Check the UI.", stream=True):
            items.append(item)
            if isinstance(item, CallEvent) and item.call.tool == "get_price":
                seen_first.set()
    result = items[-1]
    assert isinstance(result, RunResult) and result.status == "done" and result.answer is True


def test_plain_run_is_unchanged_and_callbacks_are_restored(policy: Policy) -> None:
    """Without stream the result is a RunResult; after a stream the agent keeps only its own callbacks."""
    mine: list[int] = []
    with CodeAgent(TOOLS, ScriptedModel([STEP_2, STEP_2]), policy, sandbox="auto",
                   step_callbacks=[lambda s: mine.append(s.number)]) as agent:
        streamed = list(agent.run("Price a plum.", stream=True))
        assert len(agent.step_callbacks) == 1 and not agent.call_listeners
        plain = agent.run("Price a plum.")
    assert isinstance(plain, RunResult) and plain.answer == 0.5
    assert isinstance(streamed[-1], RunResult) and mine == [1, 1]


def test_leaving_the_stream_early_lets_the_run_finish(policy: Policy) -> None:
    """Breaking out after the first call waits for the run to end; the agent is then free for another run."""
    with CodeAgent(TOOLS, ScriptedModel([STEP_1, STEP_2, STEP_2]), policy, sandbox="auto") as agent:
        stream = agent.run("Price some fruit.", stream=True)
        first = next(stream)
        stream.close()  # type: ignore[attr-defined]
        assert isinstance(first, CallEvent)
        again = agent.run("Price a plum.")
    assert again.status == "done" and again.answer == 0.5


def test_tool_calling_agent_streams_too(policy: Policy) -> None:
    """A ToolCallingAgent yields its function calls and steps the same way."""
    responses = [ModelResponse.calling(("get_price", {"item": "fig"})),
                 ModelResponse.calling(("final_answer", {"answer": "3.0"}))]
    with ToolCallingAgent(TOOLS, ScriptedModel(responses), policy) as agent:
        items = list(agent.run("Price a fig.", stream=True))
    result = items[-1]
    assert isinstance(result, RunResult) and result.status == "done", result
    assert [(e.step, e.call.tool) for e in items if isinstance(e, CallEvent)] == [(1, "get_price")]


def test_an_error_raised_by_the_run_is_raised_to_the_caller(policy: Policy) -> None:
    """What a plain run would raise (here a KeyboardInterrupt from the model) the stream raises."""
    def interrupt(_messages: Sequence[Message]) -> str:
        raise KeyboardInterrupt

    with CodeAgent(TOOLS, ScriptedModel([interrupt]), policy, sandbox="auto") as agent:
        with pytest.raises(KeyboardInterrupt):
            list(agent.run("Anything.", stream=True))
