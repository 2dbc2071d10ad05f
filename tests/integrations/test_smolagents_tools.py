"""smolagents tools are accepted as they are wherever proctor takes tools."""

from __future__ import annotations

import pytest

from integrations.smol_tools import CALLS, Summer, get_weather
from proctor import CodeAgent, Gate, Interpreter, Policy, ScriptedModel, ToolCallingAgent, ToolDenied
from proctor.agent.models import ModelResponse, ToolCallRequest
from proctor.errors import ToolDefinitionError
from proctor.tools import as_tool

ALLOW = Policy.from_dict({"version": 1, "default": "allow"})


def test_tool_decorated_function_keeps_its_schema_and_description() -> None:
    """An @smolagents.tool becomes a Tool with its description, typed parameters and output type."""
    t = as_tool(get_weather)
    assert t.name == "get_weather" and t.description == "Tell the weather in a city."
    assert t.parameters["required"] == ["city"]
    assert t.parameters["properties"]["city"] == {"type": "string", "description": "The city's name."}
    assert t.output_type == "string" and t.source is get_weather


def test_every_input_type_maps_onto_the_validated_schema() -> None:
    """integer, array, number, boolean, object and string, nullable or not, are validated as declared."""
    t = as_tool(Summer())
    props = t.parameters["properties"]
    assert props["a"]["type"] == "integer" and props["xs"]["type"] == "array"
    assert {s["type"] for s in props["scale"]["anyOf"]} == {"number", "null"}
    assert {s["type"] for s in props["negate"]["anyOf"]} == {"boolean", "null"}
    assert {s["type"] for s in props["meta"]["anyOf"]} == {"object", "null"}
    assert t.parameters["required"] == ["a", "xs"]
    assert t.validate({"a": 1, "xs": [2], "negate": True})["negate"] is True
    with pytest.raises(ToolDenied, match="argument 'a'"):
        t.validate({"a": "one", "xs": []})
    with pytest.raises(ToolDenied, match="argument 'xs'"):
        t.validate({"a": 1, "xs": 5})
    with pytest.raises(ToolDenied, match="unexpected argument 'b'"):
        t.validate({"a": 1, "xs": [], "b": 2})


def test_gate_register_runs_the_tool_object_and_its_setup_once() -> None:
    """Gate.register takes a Tool instance; calls run its forward after a single setup()."""
    summer = Summer()
    gate = Gate(ALLOW, tools=[summer])
    assert gate.call("summer", {"a": 1, "xs": [2, 3], "scale": 2}) == 12
    assert gate.call("summer", {"a": 1, "xs": [], "negate": True}) == -1
    assert summer.setups == 1


def test_interpreter_calls_smolagents_tools_through_the_gate() -> None:
    """Inside a program the tools are called by position or keyword and every call is a gate record."""
    CALLS.clear()
    with Interpreter([get_weather, Summer()], Gate(ALLOW), sandbox="process") as py:
        r = py.run("w = get_weather('Oslo')\ns = summer(1, [2, 3], scale=0.5)\n(w, s)")
    assert r.error is None, r.error
    assert r.value == ["sunny in Oslo", 3.0] or r.value == ("sunny in Oslo", 3.0)
    assert [c.tool for c in r.tool_calls] == ["get_weather", "summer"]
    assert [name for name, _ in CALLS] == ["get_weather", "summer"]


def test_code_agent_and_tool_calling_agent_take_smolagents_tools() -> None:
    """Both proctor agents accept smolagents tools in tools=[...] and call them governed."""
    model = ScriptedModel(["```python\nfinal_answer(get_weather('Rome'))\n```"])
    with CodeAgent([get_weather], model, ALLOW, sandbox="process") as agent:
        assert agent.run("weather?").answer == "sunny in Rome"
    calls = [ToolCallRequest(id="c1", name="summer", arguments={"a": 2, "xs": [3]})]
    scripted = ScriptedModel([ModelResponse(content="", tool_calls=calls), "done"])
    with ToolCallingAgent([Summer()], scripted, ALLOW) as agent2:
        result = agent2.run("add")
    assert result.steps[0].tool_calls[0].status == "ok"


def test_wrong_objects_say_what_they_are_and_what_was_expected() -> None:
    """A class instead of an instance, or an unrelated object, is refused with a message that says so."""
    with pytest.raises(ToolDefinitionError, match=r"pass an instance \(Summer\(\)\)"):
        as_tool(Summer)
    with pytest.raises(ToolDefinitionError, match=r"a builtins\.int is not a tool: expected a proctor Tool"):
        Gate(ALLOW, tools=[3])  # type: ignore[list-item]
