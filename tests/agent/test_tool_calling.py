"""Tests of ToolCallingAgent: native function calls, each through the gate; and the whole loop over litellm."""

from __future__ import annotations

from pathlib import Path

from proctor.agent import LiteLLMModel, ModelResponse, ScriptedModel, ToolCallingAgent, ToolCallRequest
from proctor.audit import verify
from proctor.policy import Policy
from proctor.testing import SpanCapture

from .conftest import TOOLS
from .openai_server import completion, serve, tool_call


def test_several_calls_per_response_each_gated(policy: Policy, tmp_path: Path) -> None:
    """Three calls in one response: two run, one is denied; results and the refusal go back as tool messages."""
    capture = SpanCapture()
    model = ScriptedModel([
        ModelResponse.calling(("get_price", {"item": "fig"}), ("delete_item", {"item": "fig"}),
                              ("send_note", {"to": "team", "text": "figs are 3.0"})),
        ModelResponse.calling(("final_answer", {"answer": "figs cost 3.0"})),
    ])
    with ToolCallingAgent(TOOLS, model, policy, audit=tmp_path / "audit.jsonl", tracer=capture.tracer) as agent:
        result = agent.run("Price of figs?")
    assert result.status == "done" and result.answer == "figs cost 3.0"
    assert [(c.tool, c.status) for c in result.tool_calls] == [
        ("get_price", "ok"), ("delete_item", "denied"), ("send_note", "ok")]
    tool_messages = [m for m in model.calls[1] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_1", "call_2", "call_3"]
    assert tool_messages[0]["content"] == "3.0"
    assert "ToolDenied" in tool_messages[1]["content"] and "nothing is deleted" in tool_messages[1]["content"]
    assert model.calls[1][1]["role"] == "user"  # the task, then the assistant's calls, then the results
    assert verify(tmp_path / "audit.jsonl").ok
    assert len(capture.spans("execute_tool ")) == 3


def test_text_reply_is_the_final_answer(policy: Policy) -> None:
    """A reply with text and no calls ends the run with that text."""
    with ToolCallingAgent(TOOLS, ScriptedModel(["Plums are cheapest."]), policy) as agent:
        result = agent.run("Cheapest?")
    assert result.status == "done" and result.answer == "Plums are cheapest."


def test_arguments_that_are_not_json_are_refused_by_the_gate(policy: Policy) -> None:
    """Malformed arguments never reach the tool: the gate refuses the call and the model is told."""
    bad = ModelResponse("", (ToolCallRequest("c1", "get_price", "{item: fig"),))
    model = ScriptedModel([bad, ModelResponse.calling(("final_answer", {"answer": "gave up"}))])
    with ToolCallingAgent(TOOLS, model, policy) as agent:
        result = agent.run("Price?")
    (call,) = result.tool_calls
    assert call.status == "denied" and call.error is not None and "mapping" in call.error
    assert "Error: ToolDenied" in model.calls[1][-1]["content"]


def test_tools_are_offered_as_json_schemas(policy: Policy) -> None:
    """The model is offered every tool's JSON schema plus final_answer."""
    seen: list[list[str]] = []

    class Recording(ScriptedModel):
        def generate(self, messages, *, tools=None, stop=None):  # type: ignore[no-untyped-def]
            seen.append([t["function"]["name"] for t in tools or []])
            return super().generate(messages, tools=tools, stop=stop)

    with ToolCallingAgent(TOOLS, Recording(["done"]), policy) as agent:
        agent.run("Go.")
    assert seen == [["get_price", "send_note", "delete_item", "final_answer"]]


def test_whole_loop_over_litellm_and_a_local_server(policy: Policy) -> None:
    """Recorded completions from a local OpenAI-compatible server drive a full run through litellm."""
    replies = [
        completion(None, [tool_call("call_x1", "get_price", {"item": "plum"}),
                          tool_call("call_x2", "get_price", {"item": "fig"})], prompt_tokens=300, completion_tokens=40),
        completion(None, [tool_call("call_x3", "final_answer", {"answer": "plum (0.5)"})], prompt_tokens=380,
                   completion_tokens=20),
    ]
    with serve(replies) as fake:
        model = LiteLLMModel("openai/gpt-4o-mini", api_base=fake.base, api_key="test")
        with ToolCallingAgent(TOOLS, model, policy) as agent:
            result = agent.run("Which is cheaper, plum or fig?")
    assert result.status == "done" and result.answer == "plum (0.5)"
    assert [(c.tool, c.args["item"], c.status) for c in result.tool_calls] == [
        ("get_price", "plum", "ok"), ("get_price", "fig", "ok")]
    assert result.usage.input_tokens == 680 and result.usage.output_tokens == 60
    assert result.cost_usd is not None and result.cost_usd > 0
    second = fake.requests[1]["body"]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "tool"]
    assert second[2]["tool_calls"][0]["function"]["name"] == "get_price"
    assert second[3] == {"role": "tool", "tool_call_id": "call_x1", "content": "0.5"}
