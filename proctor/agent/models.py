"""Models an agent talks to: a Protocol, `LiteLLMModel` for real providers, `ScriptedModel` for tests.

A model takes OpenAI-style chat messages (and, for function calling, OpenAI-style
tool schemas) and returns a `ModelResponse`: the text, any tool calls, token usage
and cost. Provider failures become a `ModelError` with one readable line; the agent
turns it into a run error.
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from proctor.calls import JSONValue
from proctor.errors import ConfigurationError, ModelError
from proctor.jsoninput import loads_bounded

__all__ = [
    "Message",
    "Model",
    "ModelError",
    "ModelResponse",
    "ScriptedModel",
    "ToolCallRequest",
    "Usage",
    "LiteLLMModel",
]

#: One chat message: ``{"role": "system"|"user"|"assistant"|"tool", "content": ..., ...}``.
Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens a model call consumed."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens)

    def as_dict(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "total_tokens": self.total_tokens}


@dataclass(frozen=True, slots=True)
class ToolCallRequest:
    """One function call the model asked for. `arguments` is the decoded JSON, or the raw text if it was not JSON."""

    id: str
    name: str
    arguments: Mapping[str, Any] | str

    def as_message(self) -> dict[str, Any]:
        args = self.arguments if isinstance(self.arguments, str) else json.dumps(dict(self.arguments), default=str)
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": args}}


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """What a model said: text, tool calls, usage, cost (None when unknown) and the model that said it."""

    content: str = ""
    tool_calls: tuple[ToolCallRequest, ...] = ()
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None
    model: str = ""

    @classmethod
    def calling(cls, *calls: tuple[str, Mapping[str, Any]], content: str = "") -> ModelResponse:
        """A response asking for `calls`, each ``(tool name, arguments)`` (handy in scripts)."""
        return cls(content, tuple(ToolCallRequest(f"call_{i}", name, dict(args)) for i, (name, args) in
                                  enumerate(calls, 1)))

    def as_message(self) -> Message:
        """The assistant message to put back into the transcript."""
        msg: Message = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [c.as_message() for c in self.tool_calls]
        return msg


@runtime_checkable
class Model(Protocol):
    """Anything that turns chat messages into a `ModelResponse`."""

    model_id: str

    def generate(
        self, messages: Sequence[Message], *, tools: Sequence[Mapping[str, JSONValue]] | None = None,
        stop: Sequence[str] | None = None,
    ) -> ModelResponse: ...


def estimate_tokens(text: str) -> int:
    """A rough token count (4 characters a token), for models that report none."""
    return (len(text) + 3) // 4


#: What `content_tokens` counts for one image part (a low-detail image in OpenAI's pricing).
IMAGE_TOKENS = 85


def content_tokens(content: Any) -> int:
    """A rough token count of a message's content: text by `estimate_tokens`, each image `IMAGE_TOKENS`."""
    if not isinstance(content, list):
        return estimate_tokens(str(content or ""))
    total = 0
    for part in content:
        if isinstance(part, Mapping) and part.get("type") == "image_url":
            total += IMAGE_TOKENS
        elif isinstance(part, Mapping):
            total += estimate_tokens(str(part.get("text") or ""))
        else:
            total += estimate_tokens(str(part))
    return total


# -- scripted -------------------------------------------------------------------------------------

ScriptItem = str | ModelResponse | Callable[[Sequence[Message]], "str | ModelResponse"]


class ScriptedModel:
    """Plays `responses` in order: strings, `ModelResponse`s, or callables of the messages.

    Usage is estimated from the text (4 characters a token) so model budgets work in
    tests; `cost_per_1k_tokens` prices it. Asking past the end raises `ModelError`.
    """

    def __init__(self, responses: Sequence[ScriptItem], *, model_id: str = "scripted",
                 cost_per_1k_tokens: float = 0.0) -> None:
        self.responses = list(responses)
        self.model_id = model_id
        self.cost_per_1k_tokens = cost_per_1k_tokens
        self.calls: list[list[Message]] = []  # every transcript the model was shown, for assertions

    def generate(
        self, messages: Sequence[Message], *, tools: Sequence[Mapping[str, JSONValue]] | None = None,
        stop: Sequence[str] | None = None,
    ) -> ModelResponse:
        n = len(self.calls)
        self.calls.append([dict(m) for m in messages])
        if n >= len(self.responses):
            raise ModelError(f"model {self.model_id!r} failed: ScriptedModel ran out of responses "
                             f"(it had {len(self.responses)}; call {n + 1} asked for another)")
        item = self.responses[n]
        out = item(messages) if callable(item) else item
        if isinstance(out, str):
            out = ModelResponse(out)
        if not isinstance(out, ModelResponse):
            raise ModelError(f"model {self.model_id!r} failed: scripted response {n + 1} is "
                             f"{type(out).__name__}, expected str or ModelResponse")
        usage = out.usage
        if usage.total_tokens == 0:
            prompt = sum(content_tokens(m.get("content")) for m in messages)
            reply = estimate_tokens(out.content) + sum(estimate_tokens(str(c.arguments)) for c in out.tool_calls)
            usage = Usage(prompt, reply)
        cost = out.cost_usd if out.cost_usd is not None else usage.total_tokens * self.cost_per_1k_tokens / 1000
        return ModelResponse(out.content, out.tool_calls, usage, cost, out.model or self.model_id)


# -- litellm --------------------------------------------------------------------------------------

def _import_litellm() -> Any:
    # Never fetch the cost map over the network at import (it hangs offline for seconds).
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import litellm
    except ImportError:
        raise ModelError("LiteLLMModel needs litellm: pip install 'proctor[litellm]'") from None
    litellm.suppress_debug_info = True
    return litellm


_NOISE = re.compile(r"^(litellm\.\w+:\s*|\w+Error:\s*|\w+Exception\s*-\s*)+")


def _off_thread(fn: Callable[[], Any]) -> Any:
    """Call `fn` in a short-lived thread and return its result or raise its exception.

    litellm's sync path calls ``asyncio.get_event_loop()``, which in the main thread
    creates and installs an event loop nobody closes (a ResourceWarning later, at a random
    place). In another thread it finds none and uses ``asyncio.run``, which cleans up.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            with warnings.catch_warnings():
                # litellm's pydantic models warn on provider quirks; they are not our users' problem.
                warnings.simplefilter("ignore")
                box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="proctor-litellm", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _credentials_problem(message: str) -> bool:
    lowered = message.lower()
    return any(word in lowered for word in ("api key", "api_key", "missing credentials"))


def _one_line(text: str, limit: int = 300) -> str:
    """The provider's message on one line, without litellm's class-path prefixes."""
    line = _NOISE.sub("", " ".join(str(text).split()))
    return line if len(line) <= limit else line[: limit - 1] + "…"


class LiteLLMModel:
    """Any model litellm reaches: ``openai/gpt-4o-mini``, ``anthropic/claude-…``, ``ollama_chat/qwen2.5-coder:7b``.

    `kwargs` go to ``litellm.completion`` on every call (``api_base``, ``api_key``,
    ``temperature``…). Rate limits, connection errors, timeouts and provider 5xx are
    retried up to `retries` times with exponential backoff from `backoff` seconds
    (the provider SDK's own retries are turned off so the two do not multiply).
    Anything else fails at once with a `ModelError`.
    """

    def __init__(self, model_id: str, *, retries: int = 4, backoff: float = 1.0, **kwargs: Any) -> None:
        if not model_id:
            raise ConfigurationError("LiteLLMModel needs a model id, e.g. 'openai/gpt-4o-mini'")
        if retries < 0 or backoff < 0:
            raise ConfigurationError("retries and backoff must not be negative")
        self.model_id = model_id
        self.retries = retries
        self.backoff = backoff
        self.kwargs = kwargs
        self.sleep: Callable[[float], None] = time.sleep  # swapped out in tests

    def __repr__(self) -> str:
        return f"LiteLLMModel({self.model_id!r})"  # never the kwargs: they may hold an api key

    def check(self) -> None:
        """Raise `ModelError` if the model cannot be used at all (litellm missing): what a resume asks
        before it runs anything, so that an approved call is not spent on a run that cannot go on."""
        _import_litellm()

    def generate(
        self, messages: Sequence[Message], *, tools: Sequence[Mapping[str, JSONValue]] | None = None,
        stop: Sequence[str] | None = None,
    ) -> ModelResponse:
        litellm = _import_litellm()
        kwargs: dict[str, Any] = {"drop_params": True, "max_retries": 0, **self.kwargs}
        if tools:
            kwargs["tools"] = [dict(t) for t in tools]
        if stop:
            kwargs["stop"] = list(stop)
        retryable = (litellm.RateLimitError, litellm.APIConnectionError, litellm.Timeout,
                     litellm.ServiceUnavailableError, litellm.InternalServerError)
        attempt = 0
        while True:
            try:
                raw = _off_thread(lambda: litellm.completion(model=self.model_id, messages=list(messages), **kwargs))
                break
            except retryable as exc:
                attempt += 1
                if _credentials_problem(str(exc)):  # some providers report a missing key as a 5xx
                    raise ModelError(self._describe(litellm, exc)) from exc
                if attempt > self.retries:
                    raise ModelError(self._describe(litellm, exc, f" (after {attempt} attempts)")) from exc
                delay = self.backoff * (2 ** (attempt - 1)) * (1 + random.random() / 4)
                self.sleep(delay)
            except Exception as exc:
                raise ModelError(self._describe(litellm, exc)) from exc
        return self._response(litellm, raw)

    def _describe(self, litellm: Any, exc: BaseException, suffix: str = "") -> str:
        message = _one_line(str(exc)) or "no message"
        kind = type(exc).__name__
        hint = ""
        auth = isinstance(exc, litellm.AuthenticationError) or _credentials_problem(message)
        if auth and "api_key" not in self.kwargs:
            try:
                missing = litellm.validate_environment(self.model_id).get("missing_keys") or []
            except Exception:  # noqa: BLE001 - the hint is optional
                missing = []
            if missing:
                hint = f" (set {', '.join(missing)})"
        return f"model {self.model_id!r} failed: {kind}: {message}{suffix}{hint}"

    def _response(self, litellm: Any, raw: Any) -> ModelResponse:
        try:
            message = raw.choices[0].message
        except (AttributeError, IndexError, TypeError):
            raise ModelError(f"model {self.model_id!r} failed: the response has no message") from None
        calls: list[ToolCallRequest] = []
        for i, tc in enumerate(getattr(message, "tool_calls", None) or []):
            fn = tc.function
            text = fn.arguments or "{}"
            try:
                # Bounded: a model's 50,000-deep arguments are a bad call, not a RecursionError.
                args: Mapping[str, Any] | str = loads_bounded(text) if isinstance(text, str) else dict(text)
            except (ValueError, TypeError):
                args = str(text)  # kept raw: the agent reports it to the model as a bad call
            if not isinstance(args, (dict, str)):
                args = str(text)
            calls.append(ToolCallRequest(getattr(tc, "id", None) or f"call_{i}", str(fn.name), args))
        usage_raw = getattr(raw, "usage", None)
        usage = Usage(int(getattr(usage_raw, "prompt_tokens", 0) or 0),
                      int(getattr(usage_raw, "completion_tokens", 0) or 0))
        cost: float | None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cost = float(litellm.completion_cost(completion_response=raw))
        except Exception:  # noqa: BLE001 - unknown price (local or new models): cost stays unknown
            cost = None
        return ModelResponse(str(message.content or ""), tuple(calls), usage, cost,
                             str(getattr(raw, "model", None) or self.model_id))
