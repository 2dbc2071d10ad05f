"""Tests for the models: ScriptedModel, and LiteLLMModel against a local OpenAI-compatible server."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from proctor.agent.models import LiteLLMModel, Message, ModelError, ModelResponse, ScriptedModel, Usage

from .openai_server import BAD_KEY, RATE_LIMITED, completion, serve, tool_call

HELLO: list[Message] = [{"role": "user", "content": "hello"}]
GET_ORDER = {"type": "function", "function": {"name": "get_order", "description": "Look up an order.",
                                              "parameters": {"type": "object",
                                                             "properties": {"order_id": {"type": "string"}},
                                                             "required": ["order_id"]}}}


def test_scripted_plays_strings_responses_and_callables_in_order() -> None:
    """Each kind of scripted item is played in turn, and the transcripts are kept."""
    def echo(messages: Sequence[Message]) -> str:
        return f"saw {len(messages)} messages"

    model = ScriptedModel(["one", ModelResponse.calling(("get_order", {"order_id": "A-1"})), echo])
    assert model.generate(HELLO).content == "one"
    second = model.generate(HELLO)
    assert second.tool_calls[0].name == "get_order" and second.tool_calls[0].arguments == {"order_id": "A-1"}
    assert model.generate([*HELLO, *HELLO]).content == "saw 2 messages"
    assert len(model.calls) == 3


def test_scripted_estimates_usage_and_prices_it() -> None:
    """Usage is estimated from the text when the script gives none, and priced per 1k tokens."""
    model = ScriptedModel(["x" * 400], cost_per_1k_tokens=1.0)
    response = model.generate([{"role": "user", "content": "y" * 800}])
    assert response.usage == Usage(200, 100)
    assert response.cost_usd == pytest.approx(0.3)


def test_scripted_runs_out_clearly() -> None:
    """Asking past the end of the script is a ModelError that says so."""
    model = ScriptedModel(["only"])
    model.generate(HELLO)
    with pytest.raises(ModelError, match="ran out of responses"):
        model.generate(HELLO)


def test_litellm_text_completion_with_usage_and_cost() -> None:
    """A plain completion comes back with its text, token usage and a cost from litellm's price map."""
    with serve([completion("Thought: done\n```python\nfinal_answer(42)\n```", prompt_tokens=120,
                           completion_tokens=30)]) as fake:
        model = LiteLLMModel("openai/gpt-4o-mini", api_base=fake.base, api_key="test")
        response = model.generate(HELLO, stop=["Observation:"])
    assert "final_answer(42)" in response.content
    assert response.usage == Usage(120, 30)
    assert response.cost_usd is not None and response.cost_usd > 0
    assert response.model.startswith("gpt-4o-mini")
    sent = fake.requests[0]["body"]
    assert sent["messages"] == HELLO and sent["stop"] == ["Observation:"]


def test_litellm_tool_call_response() -> None:
    """Native function calls are decoded: ids, names, JSON arguments; bad JSON stays raw."""
    calls = [tool_call("call_a", "get_order", {"order_id": "A-1"}), tool_call("call_b", "get_order", "{not json")]
    with serve([completion(None, calls)]) as fake:
        model = LiteLLMModel("openai/gpt-4o-mini", api_base=fake.base, api_key="test")
        response = model.generate(HELLO, tools=[GET_ORDER])
    assert response.content == ""
    assert [(c.id, c.name) for c in response.tool_calls] == [("call_a", "get_order"), ("call_b", "get_order")]
    assert response.tool_calls[0].arguments == {"order_id": "A-1"}
    assert response.tool_calls[1].arguments == "{not json"
    assert fake.requests[0]["body"]["tools"][0]["function"]["name"] == "get_order"


def test_litellm_retries_rate_limits_with_backoff() -> None:
    """A 429 is retried after a growing pause, and the next answer is returned."""
    pauses: list[float] = []
    with serve([RATE_LIMITED, RATE_LIMITED, completion("ok")]) as fake:
        model = LiteLLMModel("openai/gpt-4o-mini", api_base=fake.base, api_key="test", backoff=0.5)
        model.sleep = pauses.append
        assert model.generate(HELLO).content == "ok"
    assert len(fake.requests) == 3
    assert len(pauses) == 2 and 0.5 <= pauses[0] < pauses[1]


def test_litellm_gives_up_after_the_retries() -> None:
    """Rate limits past the retry count become one ModelError naming the model and the attempts."""
    with serve([RATE_LIMITED, RATE_LIMITED]) as fake:
        model = LiteLLMModel("openai/gpt-4o-mini", api_base=fake.base, api_key="test", retries=1)
        model.sleep = lambda _s: None
        with pytest.raises(ModelError, match=r"model 'openai/gpt-4o-mini' failed: RateLimitError: .*2 attempts"):
            model.generate(HELLO)


def test_litellm_provider_error_is_one_clear_line() -> None:
    """An authentication error fails at once, as one line with the provider's message."""
    with serve([BAD_KEY]) as fake:
        model = LiteLLMModel("openai/gpt-4o-mini", api_base=fake.base, api_key="test")
        with pytest.raises(ModelError) as info:
            model.generate(HELLO)
    message = str(info.value)
    assert message.startswith("model 'openai/gpt-4o-mini' failed: AuthenticationError: Incorrect API key")
    assert "\n" not in message and len(fake.requests) == 1


def test_litellm_missing_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an api key anywhere, the error says which variable to set."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with serve([BAD_KEY]) as fake:
        model = LiteLLMModel("openai/gpt-4o-mini", api_base=fake.base)
        with pytest.raises(ModelError, match=r"\(set OPENAI_API_KEY\)$"):
            model.generate(HELLO)


def test_litellm_deeply_nested_tool_arguments_stay_raw() -> None:
    """A model's JSON arguments nested past the input depth limit are a bad call kept as text."""
    deep = '{"a": ' + "[" * 500 + "]" * 500 + "}"  # deeper still, litellm's own parsing fails first
    with serve([completion(None, [tool_call("call_a", "get_order", deep)])]) as fake:
        model = LiteLLMModel("openai/gpt-4o-mini", api_base=fake.base, api_key="test")
        response = model.generate(HELLO, tools=[GET_ORDER])
    assert response.tool_calls[0].arguments == deep
