"""An ordinary smolagents CodeAgent, governed by proctor with two changed lines (marked below).

    python examples/smolagents_agent.py                                  # scripted model, offline
    python examples/smolagents_agent.py --model openai/gpt-4o-mini        # a real model via smolagents' LiteLLMModel

The agent's programs now run in proctor's sandbox, and every tool call inside them is
decided by examples/policies/smolagents.yaml, audited and traced: the weather is read,
the table for eight is refused (the model reads the refusal and books for six instead),
and a second booking would pass the budget.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from smolagents import CodeAgent, LiteLLMModel, Model, tool
from smolagents.models import ChatMessage, MessageRole
from smolagents.monitoring import TokenUsage

from proctor.integrations.smolagents import GovernedExecutor  # proctor: changed line 1 of 2

POLICY = Path(__file__).parent / "policies" / "smolagents.yaml"


@tool
def get_weather(city: str) -> str:
    """Tell today's weather in a city.

    Args:
        city: The city's name.
    """
    return f"{city}: 24°C and sunny"


@tool
def book_table(restaurant: str, people: int) -> str:
    """Book a table.

    Args:
        restaurant: The restaurant's name.
        people: How many people.
    """
    return f"booked {restaurant} for {people} (ref BK-{people:03d})"


class ScriptedModel(Model):
    """Answers from a script, so the example runs offline."""

    SCRIPT = (
        "Thought: check the weather, then book for everyone.\n<code>\nprint(get_weather('Lisbon'))\n"
        "print(book_table('Terraço', people=8))\n</code>",
        "Thought: eight was refused; book for six.\n<code>\nref = book_table('Terraço', people=6)\n"
        "final_answer(ref)\n</code>",
    )

    def __init__(self) -> None:
        super().__init__(model_id="scripted")
        self.step = 0

    def generate(self, messages: Any, stop_sequences: Any = None, response_format: Any = None,
                 tools_to_call_from: Any = None, **kwargs: Any) -> ChatMessage:
        reply = self.SCRIPT[min(self.step, len(self.SCRIPT) - 1)]
        self.step += 1
        return ChatMessage(role=MessageRole.ASSISTANT, content=reply,
                           token_usage=TokenUsage(input_tokens=0, output_tokens=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a litellm model id; offline scripted model when absent")
    parser.add_argument("--audit", default="smolagents-audit.jsonl", help="where the audit log goes")
    args = parser.parse_args()
    model = LiteLLMModel(model_id=args.model) if args.model else ScriptedModel()

    agent = CodeAgent(tools=[get_weather, book_table], model=model,
                      executor=GovernedExecutor(POLICY, audit=args.audit))  # proctor: changed line 2 of 2
    try:
        answer = agent.run("Book a table for eight at Terraço in Lisbon if the weather is good.")
    finally:
        agent.cleanup()
    print(f"answer: {answer}")
    print(f"audit log: {args.audit} (check it with: proctor audit verify {args.audit})")


if __name__ == "__main__":
    main()
