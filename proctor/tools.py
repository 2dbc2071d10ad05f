"""Tools: plain functions with a declared side-effect class, a cost and a schema.

`@tool` reads the input schema off the signature and the docstring's ``Args:``
section (Google style, as smolagents does) and refuses, at decoration time, a tool
the model could not be told how to call: no docstring, an untyped parameter, or a
parameter the ``Args:`` section does not describe.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import threading
import types
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast, overload

import pydantic
import pydantic_core

from proctor import adapters
from proctor.calls import SIDE_EFFECTS, SideEffect
from proctor.errors import ToolDefinitionError, ToolDenied
from proctor.termsafe import terminal_safe, text_safe

__all__ = ["Tool", "ToolDefinitionError", "as_tool", "run_with_timeout", "tool"]


_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters)\s*:\s*$")
_SECTION_HEADER = re.compile(r"^\s*(Returns|Yields|Raises|Examples?|Notes?|Attributes)\s*:\s*$")
_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def _plain(annotation: Any) -> Any:
    """`annotation` without its `Annotated[...]` metadata, as a signature shows it."""
    return typing.get_args(annotation)[0] if typing.get_origin(annotation) is typing.Annotated else annotation


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its description and its ``Args:`` entries."""
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    args: dict[str, str] = {}
    section = "description"
    arg_indent: int | None = None
    current: str | None = None
    for line in lines:
        if _ARGS_HEADER.match(line):
            section, arg_indent, current = "args", None, None
            continue
        if _SECTION_HEADER.match(line):
            section = "other"
            continue
        if section == "description":
            description.append(line)
        elif section == "args" and line.strip():
            indent = len(line) - len(line.lstrip())
            m = _ARG_LINE.match(line)
            if m and (arg_indent is None or indent <= arg_indent):
                arg_indent = indent
                current = m.group(1).lstrip("*")
                args[current] = m.group(3).strip()
            elif current is not None:
                args[current] = (args[current] + " " + line.strip()).strip()
    return "\n".join(description).strip(), args


@dataclass(frozen=True, eq=False)
class Tool:
    """A function the model may call, with what the gate needs to know about it.

    Build one with `@tool`, or directly with `Tool.from_function`.
    """

    name: str
    description: str
    fn: Callable[..., Any] = field(repr=False)
    side_effect: SideEffect | None
    cost: int
    parameters: Mapping[str, Any]
    signature: inspect.Signature = field(repr=False)
    arg_descriptions: Mapping[str, str] = field(repr=False)
    is_async: bool = False
    _positional: tuple[str, ...] = field(repr=False, default=())
    #: The argument model's validator (pydantic-core's, called directly: a TypeAdapter adds ~0.5 µs a call).
    _validator: pydantic_core.SchemaValidator | None = field(repr=False, default=None)
    #: The declared type of the result, as smolagents names it ("string", "object"…), when known.
    output_type: str | None = None
    #: The object the tool was made from when it was not a function (a smolagents tool), else None.
    source: Any = field(repr=False, default=None)
    #: A further check of validated arguments (an MCP tool's full JSON Schema): returns a problem, or None.
    _check: Callable[[Mapping[str, Any]], str | None] | None = field(repr=False, default=None)
    #: True for a tool that makes governed calls itself (a managed agent): the gate runs it with
    #: `run_in_call(args, scope)` (a `proctor.gate.CallScope`) instead of `run`. (A field, not a
    #: class attribute: the gate reads it on every call, and an instance attribute is the faster read.)
    in_call: bool = field(repr=False, default=False)
    #: ``(name, type)`` of each parameter, in order, when every one is a plain ``str``, ``int``, ``float`` or
    #: ``bool`` with no constraint (see `_plain_fields`) and the tool has no `_check`, else None: `validate`'s
    #: shortcut.
    _plain_args: tuple[tuple[str, type], ...] | None = field(repr=False, default=None)
    #: Where the tool comes from when that is not this process (``mcp:<server>`` for an MCP server's
    #: tool), for records and spans; None for a local tool.
    origin: str | None = None

    def run_in_call(self, args: Mapping[str, Any], scope: Any) -> Any:
        """Run inside the gate's call `scope`; only tools with `in_call` set implement it."""
        raise NotImplementedError(f"tool {self.name!r} does not run inside a call")

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        side_effect: SideEffect | None = None,
        cost: int = 0,
    ) -> Tool:
        """Make a tool of `fn`; raise `ToolDefinitionError` saying what is missing."""
        tool_name: str = name or str(getattr(fn, "__name__", ""))
        if not tool_name.isidentifier():
            raise ToolDefinitionError(f"tool name {tool_name!r} is not a Python identifier")
        if side_effect is not None and side_effect not in SIDE_EFFECTS:
            raise ToolDefinitionError(
                f"tool {tool_name!r}: unknown side_effect {side_effect!r} "
                f"(expected one of {', '.join(SIDE_EFFECTS)})"
            )
        if not isinstance(cost, int) or isinstance(cost, bool) or cost < 0:
            raise ToolDefinitionError(f"tool {tool_name!r}: cost must be a non-negative integer, got {cost!r}")
        doc = inspect.getdoc(fn)
        if not doc:
            raise ToolDefinitionError(f"tool {tool_name!r} has no docstring: the model needs one to use it")
        description, arg_docs = _parse_docstring(doc)
        if not description:
            raise ToolDefinitionError(f"tool {tool_name!r}: the docstring has no description before 'Args:'")
        signature = inspect.signature(fn)
        try:
            # The model validates against the full annotation: `Annotated[int, Field(gt=0)]` keeps its
            # constraints (without include_extras they were dropped and never enforced); the
            # signature shown to models keeps the plain type.
            hints = typing.get_type_hints(fn, include_extras=True)
        except Exception as exc:
            raise ToolDefinitionError(f"tool {tool_name!r}: cannot resolve type hints: {exc}") from exc
        fields: dict[str, Any] = {}
        for pname, param in signature.parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ToolDefinitionError(f"tool {tool_name!r}: *{pname} parameters cannot be described to a model")
            if pname not in hints:
                raise ToolDefinitionError(f"tool {tool_name!r}: parameter {pname!r} has no type annotation")
            if pname not in arg_docs:
                raise ToolDefinitionError(
                    f"tool {tool_name!r}: parameter {pname!r} is not described in the docstring's 'Args:' section"
                )
            default = ... if param.default is param.empty else param.default
            hint = hints[pname]
            if default is None and not _admits_none(hint):
                # `x: int = None`: the validated arguments (defaults completed) must pass validation again — an
                # approver edits them, a history entry or a cases file restates them — so None is taken as the
                # default it is (PEP 484's implicit Optional), not refused when written out.
                hint = typing.Optional[hint]  # noqa: UP045 - `hint` is a runtime value, not an annotation
            fields[pname] = (hint, pydantic.Field(default, description=arg_docs[pname]))
        # Show resolved types (``str``), not the strings `from __future__ import annotations` leaves.
        signature = signature.replace(
            parameters=[p.replace(annotation=_plain(hints[p.name])) for p in signature.parameters.values()],
            return_annotation=_plain(hints.get("return", signature.return_annotation)),
        )
        extra = sorted(set(arg_docs) - set(signature.parameters))
        if extra:
            raise ToolDefinitionError(f"tool {tool_name!r}: 'Args:' describes unknown parameter(s) {', '.join(extra)}")
        return cls.from_fields(tool_name, description, fn, fields, signature, arg_docs, side_effect=side_effect,
                          cost=cost, is_async=inspect.iscoroutinefunction(fn))

    @classmethod
    def from_parts(cls, parts: adapters.ToolParts, *, side_effect: SideEffect | None = None, cost: int = 0) -> Tool:
        """A tool from what `proctor.adapters` reads off a tool made elsewhere (a smolagents tool)."""
        return cls.from_fields(parts.name, parts.description, parts.fn, parts.fields, parts.signature,
                               parts.arg_docs, side_effect=side_effect, cost=cost, output_type=parts.output_type,
                               source=parts.source)

    @classmethod
    def from_fields(cls, name: str, description: str, fn: Callable[..., Any], fields: dict[str, Any],
                    signature: inspect.Signature, arg_docs: Mapping[str, str], *, side_effect: SideEffect | None,
                    cost: int, is_async: bool = False, output_type: str | None = None, source: Any = None,
                    schema: Mapping[str, Any] | None = None,
                    check: Callable[[Mapping[str, Any]], str | None] | None = None) -> Tool:
        """A tool from its argument fields (pydantic ``(type, Field)`` pairs) and the signature shown to models:
        what `@tool` builds from a function, and the adapters (smolagents tools, MCP tools) from a schema.

        `schema`, when given, is the JSON Schema shown to models instead of the fields' own, and
        `check` a further check of the validated arguments against it."""
        with warnings.catch_warnings():
            # A parameter named like a BaseModel attribute (`schema`, `json`, `copy`) is fine: the
            # model only validates, its fields are read from __dict__, never as attributes.
            warnings.filterwarnings("ignore", message=r"Field name .* shadows an attribute", category=UserWarning)
            model = pydantic.create_model(
                f"{name}_args",
                __config__=pydantic.ConfigDict(extra="forbid", strict=False, arbitrary_types_allowed=False),
                **fields,
            )
        if schema is None:
            derived = model.model_json_schema()
            derived.pop("title", None)
            for prop in derived.get("properties", {}).values():
                prop.pop("title", None)
            schema = derived
        return cls(
            name=name,
            description=description,
            fn=fn,
            side_effect=side_effect,
            cost=cost,
            parameters=schema,
            signature=signature,
            arg_descriptions=dict(arg_docs),
            is_async=is_async,
            _positional=tuple(
                p.name for p in signature.parameters.values() if p.kind is inspect.Parameter.POSITIONAL_ONLY
            ),
            _validator=model.__pydantic_validator__,
            output_type=output_type,
            source=source,
            _check=check,
            _plain_args=_plain_fields(model) if check is None else None,  # a check sees every call's arguments
        )

    def bind(self, args: tuple[Any, ...] = (), kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Map positional and keyword arguments onto parameter names, as a call would."""
        try:
            bound = self.signature.bind(*args, **(kwargs or {}))
        except TypeError as exc:
            raise ToolDenied(f"invalid call to {self.name}: {exc}", tool=self.name) from None
        return dict(bound.arguments)

    def validate(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Check `args` against the schema; raise `ToolDenied` naming the argument and what was expected."""
        if self._validator is None:
            raise ToolDenied(f"invalid call to {self.name}: the tool has no schema", tool=self.name)
        plain = self._plain_args
        if plain is not None and type(args) is dict and len(args) == len(plain):
            # Every argument given, each of exactly its parameter's plain type: pydantic would return
            # these very objects (checked in tests/test_tools.py), so the model is not built.
            # 7.2k -> 1.6k instructions a call of a one-string tool (callgrind, in-process loop).
            valid: dict[str, Any] = {}
            for name, kind in plain:
                value = args.get(name, valid)  # `valid`: a default of no plain type
                if type(value) is not kind:
                    break
                valid[name] = value
            else:
                return valid
        try:
            model = self._validator.validate_python(args if type(args) is dict else dict(args))
        except pydantic.ValidationError as exc:
            problems = []
            for err in exc.errors():
                loc = ".".join(str(p) for p in err["loc"]) or "arguments"
                if err["type"] == "extra_forbidden":
                    problems.append(f"unexpected argument {loc!r}")
                elif err["type"] == "missing":
                    problems.append(f"missing argument {loc!r}")
                else:
                    problems.append(f"argument {loc!r}: {err['msg']} (got {err.get('input')!r})")
            raise ToolDenied(f"invalid call to {self.name}: {'; '.join(problems)}", tool=self.name) from None
        valid = dict(model.__dict__)  # the fields, in signature order (extra arguments are refused)
        if self._check is not None:
            problem = self._check(valid)
            if problem:
                raise ToolDenied(f"invalid call to {self.name}: {problem}", tool=self.name)
        return valid

    def invoke(self, args: Mapping[str, Any]) -> Any:
        """Call the function with validated arguments by name (positional-only ones by position)."""
        if not self._positional:
            return self.fn(**args)
        rest = dict(args)
        positional = [rest.pop(name) for name in self._positional if name in rest]
        return self.fn(*positional, **rest)

    def run(self, args: Mapping[str, Any], timeout_s: float | None = None) -> Any:
        """Call the tool (sync or async) with validated `args`; raise TimeoutError past `timeout_s`.

        A sync tool that times out keeps running in an abandoned daemon thread: Python
        cannot kill a thread, so the gate records the call as timed out and moves on.
        """
        if self.is_async:
            async def runner() -> Any:
                return await asyncio.wait_for(self.invoke(args), timeout_s)

            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return asyncio.run(runner())
            return run_with_timeout(lambda: asyncio.run(runner()), None)  # this thread's loop is busy
        if timeout_s is None:
            return self.invoke(args)
        return run_with_timeout(lambda: self.invoke(args), timeout_s)

    def signature_text(self) -> str:
        """``name(a: str, b: int = 2) -> str``, as shown to a model."""
        return f"{self.name}{self.signature}"

    def json_schema(self) -> dict[str, Any]:
        """The OpenAI-style function description (litellm ``tools=``). What the model reads of it is escaped
        (`proctor.termsafe.terminal_safe`): a schema may be an MCP server's, whose descriptions, titles and enum
        values could carry ANSI escapes or bidi overrides. `parameters` itself stays as written: calls (and
        approvers' edits) are validated against it."""
        parameters = _escaped(dict(self.parameters))
        return {
            "type": "function",
            "function": {"name": self.name, "description": text_safe(self.description),
                         "parameters": parameters if isinstance(parameters, dict) else {}},
        }

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function directly, ungoverned; agents never do this, the gate does."""
        return self.fn(*args, **kwargs)


def _escaped(value: Any, depth: int = 0) -> Any:
    """`value` (JSON) with every string in it escaped by `terminal_safe`, keys too; past 64 levels, None (an MCP
    tool's definition is bounded to that depth before it becomes a tool)."""
    if depth > 64:
        return None
    if isinstance(value, str):
        return text_safe(value)
    if isinstance(value, Mapping):
        return {terminal_safe(str(k)): _escaped(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_escaped(v, depth + 1) for v in value]
    return value


_PLAIN_TYPES = (str, int, float, bool)


def _admits_none(hint: Any) -> bool:
    """Whether the annotation `hint` takes None (Any, None, Optional/a union with None, Annotated over one)."""
    if hint is Any or hint is None or hint is type(None):
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return _admits_none(typing.get_args(hint)[0])
    if origin is typing.Union or origin is types.UnionType:
        return any(_admits_none(arg) for arg in typing.get_args(hint))
    return False


def _plain_fields(model: type[pydantic.BaseModel]) -> tuple[tuple[str, type], ...] | None:
    """``(name, type)`` of the model's fields when each is a plain str/int/float/bool (no constraint or
    alias: `Tool.from_fields` makes the model of fields alone, no validators), else None. For such a model and
    an argument of exactly its type, lax validation returns the argument itself (a lone surrogate, a huge
    int, nan and -0.0 included)."""
    if model.model_config.get("extra") != "forbid":
        return None
    out: list[tuple[str, type]] = []
    for name, info in model.model_fields.items():
        kind = info.annotation
        if (kind not in _PLAIN_TYPES or info.metadata or info.alias is not None or info.validation_alias is not None
                or info.discriminator is not None):
            return None
        out.append((name, cast(type, kind)))
    return tuple(out)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *, name: str | None = None, side_effect: SideEffect | None = None, cost: int = 0
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    side_effect: SideEffect | None = None,
    cost: int = 0,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a tool: ``@tool`` or ``@tool(side_effect="external", cost=1)``.

    A tool whose side-effect class is declared neither here nor in the policy is
    treated as destructive. A parameter written ``x: T = None`` takes None (its default)
    when a call writes it out, as the arguments the gate completes with defaults do.
    """
    if fn is not None:
        return Tool.from_function(fn)

    def decorate(f: Callable[..., Any]) -> Tool:
        return Tool.from_function(f, name=name, side_effect=side_effect, cost=cost)

    return decorate


def as_tool(obj: Any) -> Tool:
    """The one conversion everything that takes tools uses: a `Tool` as is, a smolagents tool
    (``@smolagents.tool`` or a ``smolagents.Tool`` instance) mapped from its ``inputs``, or a
    function with a docstring. Anything else is a `ToolDefinitionError` saying what it got."""
    if isinstance(obj, Tool):
        return obj
    if adapters.is_smolagents_tool(obj):
        return Tool.from_parts(adapters.smolagents_parts(obj))
    if isinstance(obj, type):
        hint = f"; pass an instance ({obj.__name__}())" if adapters.is_smolagents_tool_class(obj) else ""
        raise ToolDefinitionError(f"got the class {obj.__name__!r}, not a tool{hint}")
    if callable(obj) and (inspect.isroutine(obj) or isinstance(getattr(obj, "__name__", None), str)):
        return Tool.from_function(obj)
    raise ToolDefinitionError(
        f"a {type(obj).__module__}.{type(obj).__qualname__} is not a tool: expected a proctor Tool (@proctor.tool), "
        "a function with a typed signature and a docstring, or a smolagents tool (@smolagents.tool or a Tool instance)"
    )


def run_with_timeout(fn: Callable[[], Any], timeout_s: float | None) -> Any:
    """Run `fn` in a daemon thread; return its result or raise its exception, or TimeoutError past `timeout_s`.

    On a timeout the thread is abandoned, not killed (Python cannot kill a thread).
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - carried back to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="proctor-tool", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError
    if "error" in box:
        raise box["error"]
    return box.get("value")
