"""The `invoke_agent {agent}` span of a run and the `step {n}` spans under it.

Both are made current while they last (one context attach per run and per step is
cheap), so logs and instrumented libraries called during them carry their ids. Tool
calls are parented explicitly: pass `step.context` as `parent=` to `gate.submit` or to
`Interpreter.run`, which carries it to the host side of the sandbox channel.

    with agent_span(None, agent_name="support", run=ctx.info, model="ollama_chat/qwen2.5") as run_span:
        for n in range(1, max_steps + 1):
            with step_span(None, step=n, parent=run_span) as step:
                step.usage(input_tokens=812, output_tokens=64)
                step.code(program)                       # recorded only with content capture on
                gate.submit("lookup", {"order": "A1"}, context=ctx, parent=step.context)
        run_span.finish("done")
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, TraceFlags, Tracer

from proctor.calls import RunInfo
from proctor.telemetry import metrics
from proctor.telemetry import semconv as sc
from proctor.telemetry.base import (
    _OK_STATUSES,
    _Handle,
    _set_error,
    capture_content,
    content_json,
    get_tracer,
    record_exception,
)

__all__ = ["AgentSpan", "StepSpan", "agent_span", "provider_from_model", "step_span"]

# litellm model prefixes → `gen_ai.provider.name` well-known values (others pass through).
_PROVIDERS = {
    "openai": "openai", "azure": "azure.ai.openai", "azure_ai": "azure.ai.inference", "anthropic": "anthropic",
    "bedrock": "aws.bedrock", "vertex_ai": "gcp.vertex_ai", "gemini": "gcp.gemini", "groq": "groq",
    "mistral": "mistral_ai", "deepseek": "deepseek", "cohere": "cohere", "perplexity": "perplexity",
    "xai": "x_ai", "watsonx": "ibm.watsonx.ai", "ollama": "ollama", "ollama_chat": "ollama",
}


def provider_from_model(model: str | None) -> str:
    """`gen_ai.provider.name` for a litellm model id (``ollama_chat/qwen2.5`` → ``ollama``)."""
    if not model:
        return "unknown"
    prefix, sep, _ = model.partition("/")
    if sep:
        return _PROVIDERS.get(prefix, prefix)
    if model.startswith(("gpt-", "o1", "o3", "o4")):
        return "openai"
    if model.startswith("claude"):
        return "anthropic"
    return "unknown"


class _Usage(_Handle):
    __slots__ = ("_error_type", "_finished", "_input", "_message", "_output", "_started_ns", "_status")

    def __init__(self, span: Span) -> None:
        super().__init__(span)
        self._input = 0
        self._output = 0
        self._started_ns = time.perf_counter_ns()
        self._finished = False
        self._status = "done"
        self._error_type: str | None = None
        self._message: str | None = None

    def usage(self, input_tokens: int | None = None, output_tokens: int | None = None) -> None:
        """Add a model call's token counts (`gen_ai.usage.input_tokens` / `output_tokens`)."""
        self._input += input_tokens or 0
        self._output += output_tokens or 0

    def finish(self, status: str, error_type: str | None = None, message: str | None = None) -> None:
        """The outcome: `done`/`ok`/`final_answer`, or anything else (status ERROR with `error.type`)."""
        self._finished = True
        self._status, self._error_type, self._message = status, error_type, message

    def _close(self) -> str | None:
        """Write the final attributes; return the error type, if the span ended in error."""
        error_type = None
        if self._status not in _OK_STATUSES:
            error_type = self._error_type or self._status
        if self.recording:
            if self._input or self._output:
                self.span.set_attributes({sc.GEN_AI_USAGE_INPUT_TOKENS: self._input,
                                          sc.GEN_AI_USAGE_OUTPUT_TOKENS: self._output})
            if error_type is not None:
                _set_error(self.span, error_type, self._message)
        return error_type

    def _failed(self, exc: BaseException) -> None:
        if self.recording:
            record_exception(self.span, exc)
        if not self._finished or self._status in _OK_STATUSES:
            self.finish("failed", type(exc).__name__, str(exc))

    @contextmanager
    def current(self) -> Iterator[None]:
        """Make the span current for the block (what `agent_span` and `step_span` do): an exception that
        escapes fails it, and it ends with its usage and outcome when the block does."""
        token = otel_context.attach(self.context)
        try:
            yield
        except BaseException as exc:
            self._failed(exc)
            raise
        finally:
            try:
                self._close()
            finally:
                otel_context.detach(token)
                self.span.end()


class AgentSpan(_Usage):
    """The `invoke_agent {agent}` span of one run."""

    __slots__ = ("agent_name",)

    def __init__(self, span: Span, agent_name: str) -> None:
        super().__init__(span)
        self.agent_name = agent_name

    def _close(self) -> str | None:
        error_type = super()._close()
        if self.recording:
            self.span.set_attribute(sc.PROCTOR_AGENT_STATUS, self._status)
        metrics.record_agent(agent_name=self.agent_name, duration_s=(time.perf_counter_ns() - self._started_ns) / 1e9,
                             error_type=error_type)
        return error_type


class StepSpan(_Usage):
    """The `step {n}` span of one step; its token usage also counts toward the run's."""

    __slots__ = ("_agent", "step")

    def __init__(self, span: Span, step: int, agent: AgentSpan | None) -> None:
        super().__init__(span)
        self.step = step
        self._agent = agent

    def usage(self, input_tokens: int | None = None, output_tokens: int | None = None) -> None:
        super().usage(input_tokens, output_tokens)
        if self._agent is not None:
            self._agent.usage(input_tokens, output_tokens)

    def code(self, program: str) -> None:
        """The program the model wrote for this step; recorded only with content capture on."""
        if capture_content() and self.recording:
            self.span.set_attribute(sc.PROCTOR_STEP_CODE, content_json(program))


@contextmanager
def agent_span(
    tracer: Tracer | None,
    *,
    agent_name: str,
    run: RunInfo,
    model: str | None = None,
    provider: str | None = None,
    agent_id: str | None = None,
    description: str | None = None,
    parent: Context | None = None,
    links: Sequence[tuple[str | None, str | None]] = (),
) -> Iterator[AgentSpan]:
    """Open the `invoke_agent {agent_name}` span (INTERNAL) of a run and make it current.

    `gen_ai.conversation.id` is the run id, so Tempo and Jaeger can group a run's traces.
    `links` are (trace id, span id) hex pairs of earlier spans of the same run (a resumed
    run links to the trace it started in).
    Call `.finish(status)` with how the run ended (default `done`); an exception that
    escapes marks it failed with the exception's type as `error.type`.
    """
    attributes: dict[str, Any] = {
        sc.GEN_AI_OPERATION_NAME: sc.INVOKE_AGENT,
        sc.GEN_AI_PROVIDER_NAME: provider or provider_from_model(model),
        sc.GEN_AI_AGENT_NAME: agent_name,
        sc.GEN_AI_CONVERSATION_ID: run.id,
        sc.PROCTOR_RUN_ID: run.id,
    }
    if model:
        attributes[sc.GEN_AI_REQUEST_MODEL] = model
    if agent_id:
        attributes[sc.GEN_AI_AGENT_ID] = agent_id
    if description:
        attributes[sc.GEN_AI_AGENT_DESCRIPTION] = description
    if run.principal is not None:
        attributes[sc.PROCTOR_RUN_PRINCIPAL] = run.principal
    for key, value in run.labels.items():
        attributes[sc.PROCTOR_RUN_LABELS_PREFIX + key] = str(value)
    span_links = [Link(SpanContext(int(t, 16), int(s, 16), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)),
                       {"proctor.link": "resumed_from"}) for t, s in links if t and s]
    span = get_tracer(tracer).start_span(f"{sc.INVOKE_AGENT} {agent_name}", context=parent,
                                         kind=SpanKind.INTERNAL, attributes=attributes, links=span_links)
    handle = AgentSpan(span, agent_name)
    with handle.current():
        yield handle


@contextmanager
def step_span(
    tracer: Tracer | None,
    *,
    step: int,
    parent: AgentSpan | Context | None = None,
    agent_name: str | None = None,
    run: RunInfo | None = None,
) -> Iterator[StepSpan]:
    """Open the `step {step}` span (INTERNAL) and make it current; `parent` is the run's span or a Context.

    Pass `.context` of the yielded handle as `parent=` to every gate call of the step.
    """
    agent = parent if isinstance(parent, AgentSpan) else None
    parent_ctx = agent.context if agent is not None else (parent if isinstance(parent, Context) else None)
    name = agent_name or (agent.agent_name if agent is not None else None)
    attributes: dict[str, Any] = {sc.PROCTOR_STEP: step}
    if name:
        attributes[sc.GEN_AI_AGENT_NAME] = name
    if run is not None:
        attributes[sc.PROCTOR_RUN_ID] = run.id
    span = get_tracer(tracer).start_span(f"{sc.STEP_SPAN} {step}", context=parent_ctx, kind=SpanKind.INTERNAL,
                                         attributes=attributes)
    metrics.record_step(agent_name=name or "unknown")
    handle = StepSpan(span, step, agent)
    with handle.current():
        yield handle
