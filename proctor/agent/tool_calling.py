"""`ToolCallingAgent`: the same loop over the model's native function calling.

Each function call in a response goes through `Gate.submit` in order (so approvals
are asked one at a time and budgets see them in sequence); its result, or the reason
it did not run, goes back to the model as a tool message. Calling `final_answer`
ends the run. A response with text and no calls is taken as the final answer, as
most models end that way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from opentelemetry.context import Context

from proctor.agent.attachments import with_images
from proctor.agent.base import AgentBase
from proctor.agent.models import Message, ModelResponse
from proctor.agent.observations import MAX_LOG_CHARS, describe_call, truncate
from proctor.agent.prompts import FINAL_ANSWER_SCHEMA, tool_calling_prompt
from proctor.agent.result import StepRecord
from proctor.errors import StepInterrupted
from proctor.gate import RunContext

__all__ = ["ToolCallingAgent"]


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


class ToolCallingAgent(AgentBase):
    """An agent that acts through function calls (litellm ``tools=``), each one governed."""

    default_name = "tool_calling_agent"

    def _system_prompt(self) -> str:
        return tool_calling_prompt(self.tools, self.prompt_policy(), self.instructions)

    def _ask(self, messages: Sequence[Message]) -> ModelResponse:
        schemas = [t.json_schema() for t in self.tools] + [FINAL_ANSWER_SCHEMA]
        return self.model.generate(messages, tools=schemas)

    def _act(self, step: StepRecord, response: ModelResponse, ctx: RunContext, parent: Context) -> tuple[bool, Any]:
        self.memory.append(response.as_message())
        self._announce(step)
        if not response.tool_calls:
            if response.content.strip():
                step.final_answer = True
                step.observation = "final answer (text reply without tool calls)"
                return True, response.content
            step.error = "empty response"
            step.observation = "Error: your reply had neither tool calls nor text. Call a tool or final_answer."
            self.memory.append({"role": "user", "content": step.observation})
            return False, None
        lines: list[str] = []
        finished, answer = False, None
        for request in response.tool_calls:
            if request.name == "final_answer":
                given = request.arguments
                finished, answer = True, given.get("answer", dict(given)) if not isinstance(given, str) else given
                self.memory.append({"role": "tool", "tool_call_id": request.id, "content": "ok"})
                continue
            # Arguments that were not a JSON object go to the gate too: it refuses and audits them.
            args: Any = request.arguments if isinstance(request.arguments, str) else dict(request.arguments)
            outcome = self.gate.submit(request.name, args, context=ctx, parent=parent)
            record = outcome.record
            if outcome.error is not None:
                content = f"Error: {type(outcome.error).__name__}: {outcome.error}"
            else:  # an image becomes its handle here; the image follows the tool messages
                content = truncate(_render(self.images.take(record.call_id, record.tool, outcome.value)),
                                   MAX_LOG_CHARS)
            step.tool_calls.append(record)
            lines.append(describe_call(len(step.tool_calls), record))
            self.memory.append({"role": "tool", "tool_call_id": request.id, "content": content})
            if isinstance(outcome.error, StepInterrupted):  # suspended: the rest waits for the resume
                finished = False
                break
        step.observation = "\n".join(lines) if lines else "final answer"
        step.final_answer = finished
        images, described = self.images.drain()
        step.images += described
        if images:  # tool messages hold text only: the images come in a user message after them
            self.memory.append({"role": "user", "content": with_images(
                f"The {len(images)} image(s) the calls above returned, in the order of their handles:", images)})
        return finished, answer

