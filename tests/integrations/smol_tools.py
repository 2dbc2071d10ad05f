"""smolagents tools used by the integration tests: @tool functions, a Tool subclass and a scripted model."""

from __future__ import annotations

from typing import Any

import smolagents
from smolagents import tool
from smolagents.models import (
    ChatMessage,
    ChatMessageToolCall,
    ChatMessageToolCallFunction,
    MessageRole,
)
from smolagents.monitoring import TokenUsage

CALLS: list[tuple[str, dict[str, Any]]] = []
#: What `book_table` and `charge` (the managed-agent tests' side effects) really ran.
RAN: list[tuple[str, dict[str, Any]]] = []


@tool  # smolagents warns about any other spelling of its decorator
def book_table(people: int) -> str:
    """Book a table.

    Args:
        people: How many people.
    """
    RAN.append(("book_table", {"people": people}))
    return f"booked for {people}"


@tool  # smolagents warns about any other spelling of its decorator
def charge(amount: int) -> str:
    """Charge the card.

    Args:
        amount: Euros.
    """
    RAN.append(("charge", {"amount": amount}))
    return f"charged {amount}"


@tool  # smolagents warns about any other spelling of its decorator
def get_weather(city: str, units: str | None = None) -> str:
    """Tell the weather in a city.

    Args:
        city: The city's name.
        units: 'metric' or 'imperial'.
    """
    CALLS.append(("get_weather", {"city": city, "units": units}))
    return f"sunny in {city}"


class Summer(smolagents.Tool):
    """A Tool subclass with every input type smolagents names."""

    name = "summer"
    description = "Add numbers up, with options."
    inputs = {  # noqa: RUF012 - smolagents declares inputs as a class attribute
        "a": {"type": "integer", "description": "The first number."},
        "xs": {"type": "array", "description": "More numbers."},
        "scale": {"type": "number", "description": "A factor.", "nullable": True},
        "negate": {"type": "boolean", "description": "Negate the sum.", "nullable": True},
        "meta": {"type": "object", "description": "Anything.", "nullable": True},
        "label": {"type": "string", "description": "A label.", "nullable": True},
    }
    output_type = "number"

    def __init__(self) -> None:
        super().__init__()
        self.setups = 0

    def setup(self) -> None:
        self.setups += 1
        self.is_initialized = True

    def forward(self, a: int, xs: list[Any], scale: float | None = 1.0, negate: bool | None = False,
                meta: dict[str, Any] | None = None, label: str | None = None) -> float:
        CALLS.append(("summer", {"a": a, "xs": xs}))
        total = (a + sum(xs)) * (scale if scale is not None else 1.0)
        return -total if negate else total


class ScriptedSmolModel(smolagents.Model):
    """A smolagents model answering from a list: text replies, or (name, arguments) tool calls."""

    def __init__(self, replies: list[Any]) -> None:
        super().__init__(model_id="scripted")
        self.replies = list(replies)
        self.seen: list[Any] = []

    def generate(self, messages: Any, stop_sequences: Any = None, response_format: Any = None,
                 tools_to_call_from: Any = None, **kwargs: Any) -> ChatMessage:
        self.seen.append(messages)
        reply = self.replies.pop(0)
        usage = TokenUsage(input_tokens=1, output_tokens=1)
        if isinstance(reply, tuple):
            call = ChatMessageToolCall(id=f"call_{len(self.seen)}", type="function",
                                       function=ChatMessageToolCallFunction(name=reply[0], arguments=reply[1]))
            return ChatMessage(role=MessageRole.ASSISTANT, content="", tool_calls=[call], token_usage=usage)
        return ChatMessage(role=MessageRole.ASSISTANT, content=reply, token_usage=usage)
