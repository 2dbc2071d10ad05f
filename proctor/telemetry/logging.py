"""Structured logs: one structlog configuration, and a library logger that stays quiet until asked.

`configure_logging()` (the CLI calls it) writes JSON lines when the stream is not a
terminal and a readable console otherwise, to stderr so stdout stays the program's.
Every event carries the run id and call id bound with `bind_run` / `bind_call`, and the
trace id and span id of the current OpenTelemetry span (or those passed explicitly,
e.g. ``log.error("x", **tool_span.log_fields())``), so a log line leads to its trace.

Library code logs through `get_logger(name)`. Until structlog is configured (by us or
by the application) its events go to the standard `logging` module instead of
structlog's default stdout printer: warnings and errors reach stderr through Python's
last-resort handler, info and debug are silent, and stdout is never written to.
"""

from __future__ import annotations

import io
import logging as stdlib_logging
import sys
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any, TextIO, cast

import structlog
from opentelemetry import trace

from proctor.errors import ConfigurationError
from proctor.termsafe import terminal_safe

__all__ = ["add_otel_ids", "bind_call", "bind_run", "configure_logging", "get_logger"]

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40, "critical": 50, "exception": 40}
_HANDLER_MARK = "_proctor_handler"


def add_otel_ids(logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: add trace_id / span_id of the current span, unless the event has them."""
    if "trace_id" not in event_dict:
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            event_dict["trace_id"] = format(ctx.trace_id, "032x")
            event_dict["span_id"] = format(ctx.span_id, "016x")
    return event_dict


@contextmanager
def bind_run(run_id: str) -> Iterator[None]:
    """Every event logged inside carries `run_id` (structlog contextvars; thread- and task-local)."""
    with structlog.contextvars.bound_contextvars(run_id=run_id):
        yield


@contextmanager
def bind_call(call_id: str, **fields: Any) -> Iterator[None]:
    """Every event logged inside carries `call_id` (and `fields`, e.g. a ToolSpan's log_fields())."""
    with structlog.contextvars.bound_contextvars(call_id=call_id, **fields):
        yield


class _CurrentStderr(io.TextIOBase):
    """A text stream that is always the current `sys.stderr`."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def _level(level: str | int) -> int:
    if isinstance(level, int):
        return level
    try:
        return _LEVELS[level.lower()]
    except KeyError:
        raise ConfigurationError(f"unknown log level {level!r}: use debug, info, warning, error or critical") from None


def configure_logging(*, json: bool | None = None, level: str | int = "info", stream: TextIO | None = None,
                      stdlib: bool = True) -> None:
    """Configure structlog for the whole process (call once, from the CLI or the application).

    `json`: JSON lines (None: when `stream` is not a TTY). `level`: the least severe level
    written. `stdlib`: also render records of the standard `logging` module (the
    OpenTelemetry exporters', for instance) the same way, at WARNING and above.
    """
    # Without a stream, write to whatever sys.stderr is when a line is written, not to the object it is
    # now: a caller that swaps stderr later (a test runner's capture, a daemon redirecting it) must not
    # leave the logger holding a closed file, where every later log line would raise.
    out = stream if stream is not None else cast(TextIO, _CurrentStderr())  # (a TextIOBase: TextIO to typing)
    is_tty = bool(getattr(out, "isatty", lambda: False)())
    as_json = (not is_tty) if json is None else json
    min_level = _level(level)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_otel_ids,
    ]
    renderer: Any = (structlog.processors.JSONRenderer() if as_json
                     else _TerminalSafe(structlog.dev.ConsoleRenderer(colors=is_tty)))
    tail: list[Any] = [structlog.processors.StackInfoRenderer(), structlog.processors.format_exc_info] if as_json \
        else [structlog.processors.StackInfoRenderer()]
    structlog.configure(
        processors=[*shared, *tail, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(min_level),
        logger_factory=structlog.WriteLoggerFactory(file=out),
        context_class=dict,
        # Not cached: module-level loggers made before this call must pick the new configuration up.
        cache_logger_on_first_use=False,
    )
    if stdlib:
        _route_stdlib(shared, renderer, out, max(min_level, stdlib_logging.WARNING))


def _route_stdlib(shared: list[Any], renderer: Any, out: TextIO, level: int) -> None:
    root = stdlib_logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _HANDLER_MARK, False):
            root.removeHandler(handler)
    handler = stdlib_logging.StreamHandler(out)
    setattr(handler, _HANDLER_MARK, True)
    handler.setLevel(level)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    ))
    root.addHandler(handler)
    if root.level > level or root.level == stdlib_logging.NOTSET:
        root.setLevel(level)


class _TerminalSafe:
    """A console renderer whose string fields go through `proctor.termsafe.terminal_safe` first:
    a log line carrying a tool's or a model's text cannot drive the terminal (JSON escapes itself)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, logger: Any, name: str, event_dict: dict[str, Any]) -> Any:
        safe = {k: terminal_safe(v, keep_newlines=True) if isinstance(v, str) else v for k, v in event_dict.items()}
        return self.inner(logger, name, safe)


class _LibraryLogger:
    """A structlog-style logger for library code that never prints to stdout uninvited."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def _log(self, method: str, event: str, kw: dict[str, Any]) -> None:
        if structlog.is_configured():
            getattr(structlog.get_logger(self._name), method)(event, logger=self._name, **kw)
            return
        std = stdlib_logging.getLogger(self._name)
        level = _LEVELS[method]
        if not std.isEnabledFor(level):
            return
        fields: dict[str, Any] = dict(structlog.contextvars.get_contextvars())
        fields.update(kw)
        add_otel_ids(None, method, fields)
        text = " ".join([event, *(f"{k}={v!r}" for k, v in fields.items())])
        std.log(level, "%s", text, exc_info=method == "exception")

    def debug(self, event: str, **kw: Any) -> None:
        self._log("debug", event, kw)

    def info(self, event: str, **kw: Any) -> None:
        self._log("info", event, kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._log("warning", event, kw)

    def error(self, event: str, **kw: Any) -> None:
        self._log("error", event, kw)

    def exception(self, event: str, **kw: Any) -> None:
        self._log("exception", event, kw)

    def critical(self, event: str, **kw: Any) -> None:
        self._log("critical", event, kw)


def get_logger(name: str) -> _LibraryLogger:
    """A logger for library code: structlog once configured, the quiet `logging` module before."""
    return _LibraryLogger(name)
