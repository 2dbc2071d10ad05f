"""The ``chat {model}`` span of each model call (runs and steps use `proctor.telemetry`).

Names and attributes follow the OpenTelemetry GenAI conventions; the span is a
child of the step's span and is not made current (nothing runs under it). With content
capture on, the chat's input and output go on it as `gen_ai.input.messages` and
`gen_ai.output.messages`, with every clear value of a redacted argument scrubbed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from proctor.agent.attachments import describe_content
from proctor.agent.models import Message, ModelResponse
from proctor.telemetry.base import capture_content, content_json
from proctor.telemetry.runs import provider_from_model
from proctor.telemetry.semconv import GEN_AI_INPUT_MESSAGES, GEN_AI_OUTPUT_MESSAGES
from proctor.textcaps import cap_text

__all__ = ["HeldChat", "model_span", "record_input", "record_output", "record_response"]


def _same(text: str) -> str:
    return text


class HeldChat:
    """A finished model call whose ``chat`` span stays open until its step ends.

    Captured chat content is written only then, scrubbed of every redacted value the step's
    calls revealed (a model's program quotes a card number before any call names it as
    redacted); the span still ends when the response came back (`end_time`).
    """

    __slots__ = ("end_ns", "messages", "response", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.messages: Sequence[Message] = ()
        self.response: ModelResponse | None = None
        self.end_ns = 0

    def answered(self, messages: Sequence[Message], response: ModelResponse) -> None:
        """The call returned: usage and model now, content at `close`."""
        self.end_ns = time.time_ns()
        self.messages, self.response = list(messages), response
        record_response(self.span, response)

    def close(self, scrub: Callable[[str], str] = _same) -> None:
        """Write the (scrubbed) content, if captured, and end the span at the time of the answer."""
        try:
            if self.response is not None:
                record_input(self.span, self.messages, scrub)
                record_output(self.span, self.response, scrub)
        finally:
            self.span.end(end_time=self.end_ns or None)


@contextmanager
def model_span(tracer: Tracer, parent: Context, *, model: str) -> Iterator[HeldChat]:
    """The ``chat {model}`` span of one model call: call `.answered()` on success, and `.close()`
    once the step is over (a failed call's span is ended here)."""
    span = tracer.start_span(f"chat {model}", context=parent, kind=SpanKind.CLIENT,
                             attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                                         "gen_ai.provider.name": provider_from_model(model)})
    held = HeldChat(span)
    try:
        yield held
    except BaseException as exc:
        span.set_attribute("error.type", type(exc).__name__)
        span.set_status(Status(StatusCode.ERROR, cap_text(str(exc))))
        span.end()
        raise
    if held.response is None:
        span.end()


def record_input(span: Span, messages: Sequence[Message], scrub: Callable[[str], str] = _same) -> None:
    """With content capture on: the chat input as `gen_ai.input.messages` (GenAI conventions), scrubbed."""
    if not (capture_content() and span.is_recording()):
        return
    shaped = [{"role": str(m.get("role", "user")), "parts": _parts(m.get("content"))} for m in messages]
    span.set_attribute(GEN_AI_INPUT_MESSAGES, scrub(content_json(shaped)))


def _parts(content: Any) -> list[dict[str, Any]]:
    """A message's content as GenAI parts; an image is its description (digest, bytes), never its data."""
    if not isinstance(content, list):
        return [{"type": "text", "content": str(content or "")}]
    parts: list[dict[str, Any]] = []
    for part in describe_content(content):
        if isinstance(part, dict) and part.get("type") == "text":
            parts.append({"type": "text", "content": str(part.get("text") or "")})
        else:
            parts.append(part if isinstance(part, dict) else {"type": "text", "content": str(part)})
    return parts


def record_response(span: Span, response: ModelResponse) -> None:
    """Put a response's model, usage and cost on its span."""
    span.set_attribute("gen_ai.response.model", response.model)
    span.set_attribute("gen_ai.usage.input_tokens", response.usage.input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", response.usage.output_tokens)
    if response.cost_usd is not None:
        span.set_attribute("proctor.model.cost_usd", response.cost_usd)


def record_output(span: Span, response: ModelResponse, scrub: Callable[[str], str] = _same) -> None:
    """With content capture on: the chat output as `gen_ai.output.messages`, scrubbed."""
    if not (capture_content() and span.is_recording()):
        return
    parts: list[dict[str, Any]] = [{"type": "text", "content": response.content}] if response.content else []
    parts += [{"type": "tool_call", "id": c.id, "name": c.name, "arguments": c.arguments}
              for c in response.tool_calls]
    shaped = [{"role": "assistant", "parts": parts, "finish_reason": "tool_call" if response.tool_calls else "stop"}]
    span.set_attribute(GEN_AI_OUTPUT_MESSAGES, scrub(content_json(shaped)))
