"""The ``chat {model}`` span of each model call (runs and steps use `proctor.telemetry`).

Names and attributes follow the OpenTelemetry GenAI conventions; the span is a
child of the step's span and is not made current (nothing runs under it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from proctor.agent.models import ModelResponse
from proctor.telemetry.runs import provider_from_model

__all__ = ["model_span", "record_response"]


@contextmanager
def model_span(tracer: Tracer, parent: Context, *, model: str) -> Iterator[Span]:
    """The ``chat {model}`` span of one model call; call `record_response` on success."""
    span = tracer.start_span(f"chat {model}", context=parent, kind=SpanKind.CLIENT,
                             attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                                         "gen_ai.provider.name": provider_from_model(model)})
    try:
        yield span
    except BaseException as exc:
        span.set_attribute("error.type", type(exc).__name__)
        span.set_status(Status(StatusCode.ERROR, str(exc)))
        raise
    finally:
        span.end()


def record_response(span: Span, response: ModelResponse) -> None:
    """Put a response's model, usage and cost on its span."""
    span.set_attribute("gen_ai.response.model", response.model)
    span.set_attribute("gen_ai.usage.input_tokens", response.usage.input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", response.usage.output_tokens)
    if response.cost_usd is not None:
        span.set_attribute("proctor.model.cost_usd", response.cost_usd)
