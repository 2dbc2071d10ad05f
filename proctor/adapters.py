"""Tools made elsewhere, taken as they are: smolagents' ``@tool`` objects and ``Tool`` instances, and what an
MCP server's annotations claim about a tool.

A smolagents tool declares its arguments as ``inputs`` — ``{"name": {"type": "string",
"description": "…", "nullable": True}}`` — and its result as ``output_type``. Those become
the validated schema and the signature shown to models; the call runs the tool object
itself (``tool(**args)``, which runs its ``setup()`` once). Nothing here imports smolagents:
a smolagents tool can only exist once smolagents is imported, so it is looked up in
``sys.modules``. Nothing here builds a proctor `Tool` either: `ToolParts` is what one is built
from (`proctor.tools.as_tool` builds it), so this module sits below the tools it feeds.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional, Union

import pydantic

from proctor.calls import SideEffect
from proctor.errors import ToolDefinitionError

__all__ = ["SMOLAGENTS_TYPES", "ToolParts", "is_smolagents_tool", "is_smolagents_tool_class", "side_effect_of",
           "smolagents_parts"]

#: smolagents' input and output types, as Python types for validation and signatures.
SMOLAGENTS_TYPES: dict[str, Any] = {
    "string": str, "integer": int, "number": float, "boolean": bool, "array": list[Any],
    "object": dict[str, Any], "any": Any, "null": type(None), "image": Any, "audio": Any,
}


def _smolagents_base() -> type | None:
    module = sys.modules.get("smolagents.tools")
    base = getattr(module, "BaseTool", None) if module is not None else None
    return base if isinstance(base, type) else None


def _smolagents_tool_class() -> type | None:
    module = sys.modules.get("smolagents.tools")
    cls = getattr(module, "Tool", None) if module is not None else None
    return cls if isinstance(cls, type) else None


def is_smolagents_tool(obj: Any) -> bool:
    """Whether `obj` is a smolagents tool instance (``@smolagents.tool`` or a ``smolagents.Tool``)."""
    base = _smolagents_base()
    return base is not None and isinstance(obj, base)


def is_smolagents_tool_class(obj: Any) -> bool:
    """Whether `obj` is a smolagents tool class (which must be instantiated to be a tool)."""
    base = _smolagents_base()
    return base is not None and isinstance(obj, type) and issubclass(obj, base)


def _python_type(name: str, where: str, declared: Any) -> Any:
    names = declared if isinstance(declared, list) else [declared]
    types = []
    for n in names:
        if not isinstance(n, str) or n not in SMOLAGENTS_TYPES:
            raise ToolDefinitionError(
                f"{where}: type {n!r} is not one of smolagents' types ({', '.join(SMOLAGENTS_TYPES)})"
            )
        types.append(SMOLAGENTS_TYPES[n])
    if any(t is Any for t in types):
        return Any
    return types[0] if len(types) == 1 else Union[tuple(types)]  # noqa: UP007 - built at run time


def _dotted(text: str, namespace: dict[str, Any]) -> Any:
    """The object a dotted name (``DataFrame``, ``pd.DataFrame``) names in `namespace`; the text otherwise
    (looked up, never evaluated)."""
    head, *rest = text.strip().strip("'\"").split(".")
    if not head.isidentifier() or not all(part.isidentifier() for part in rest) or head not in namespace:
        return text
    value = namespace[head]
    for part in rest:
        value = getattr(value, part, text)
    return value


@dataclass(frozen=True, slots=True)
class ToolParts:
    """What a proctor `Tool` is built from (`Tool.from_fields`), read off a tool made elsewhere."""

    name: str
    description: str
    fn: Callable[..., Any]
    #: The arguments as pydantic ``(type, Field)`` pairs: the validated schema.
    fields: dict[str, Any]
    #: The signature shown to models.
    signature: inspect.Signature
    arg_docs: dict[str, str]
    output_type: str | None
    #: The object the tool was made from (what `Tool.source` keeps).
    source: object


def side_effect_of(annotations: Mapping[str, Any] | pydantic.BaseModel | None) -> SideEffect:
    """The side-effect class an MCP server's tool annotations claim, read with MCP's defaults (destructive,
    open-world). Only a toolset built with ``trust_annotations=True`` uses it."""
    if isinstance(annotations, pydantic.BaseModel):
        dumped = annotations.model_dump(by_alias=True, mode="json", exclude_none=True)
        hints: dict[str, Any] = dumped if isinstance(dumped, dict) else {}
    else:
        hints = dict(annotations or {})
    if hints.get("readOnlyHint") is True:
        return "read"
    if hints.get("destructiveHint", True) is not False:
        return "destructive"
    if hints.get("openWorldHint", True) is not False:
        return "external"
    return "write"


def smolagents_parts(obj: Any) -> ToolParts:
    """What a proctor `Tool` calling the smolagents tool `obj` is built from, its ``inputs`` as the validated
    schema (`proctor.tools.as_tool` builds it)."""
    name = getattr(obj, "name", None)
    label = f"smolagents tool {name!r}" if isinstance(name, str) else f"a {type(obj).__name__}"
    if not isinstance(name, str) or not name.isidentifier():
        raise ToolDefinitionError(f"{label}: its name must be a Python identifier")
    description = getattr(obj, "description", None)
    if not isinstance(description, str) or not description.strip():
        raise ToolDefinitionError(f"{label} has no description: the model needs one to use it")
    inputs = getattr(obj, "inputs", None)
    if not isinstance(inputs, dict):
        raise ToolDefinitionError(f"{label}: 'inputs' must be a dict of name -> {{type, description}}")
    output_type = getattr(obj, "output_type", None)
    try:
        forward = inspect.signature(obj.forward).parameters
    except (AttributeError, TypeError, ValueError):
        forward = {}  # type: ignore[assignment]
    fields: dict[str, Any] = {}
    params: list[inspect.Parameter] = []
    docs: dict[str, str] = {}
    keyword_only = False
    for arg, spec in inputs.items():
        where = f"{label}, input {arg!r}"
        if not isinstance(arg, str) or not arg.isidentifier():
            raise ToolDefinitionError(f"{label}: input name {arg!r} is not a Python identifier")
        if not isinstance(spec, dict) or "type" not in spec:
            raise ToolDefinitionError(f"{where}: expected {{'type': …, 'description': …}}, got {spec!r}")
        py = _python_type(arg, where, spec["type"])
        nullable = bool(spec.get("nullable"))
        if nullable and py is not Any:
            py = Optional[py]  # noqa: UP045 - built at run time
        declared = forward.get(arg)
        if declared is not None and declared.default is not inspect.Parameter.empty:
            default: Any = declared.default
        elif nullable:
            default = None
        else:
            default = inspect.Parameter.empty
        docs[arg] = str(spec.get("description", ""))
        fields[arg] = (py, pydantic.Field(... if default is inspect.Parameter.empty else default,
                                          description=docs[arg]))
        if default is inspect.Parameter.empty and params and params[-1].default is not inspect.Parameter.empty:
            keyword_only = True  # a required input after an optional one: by keyword from here on
        kind = inspect.Parameter.KEYWORD_ONLY if keyword_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
        params.append(inspect.Parameter(arg, kind, default=default, annotation=py))
    returns = SMOLAGENTS_TYPES.get(output_type, Any) if isinstance(output_type, str) else Any
    try:  # the class forward() says it returns: truer than smolagents' type name ("object" for any class)
        # smolagents' @tool compiles forward() in its own module: names resolve where the function was written.
        home = sys.modules.get(getattr(obj.forward, "__module__", None) or "")
        declared_return = inspect.signature(obj.forward, globals=vars(home) if home is not None else None,
                                            eval_str=True).return_annotation
        if isinstance(declared_return, str) and home is not None:  # its source quotes them once more
            declared_return = _dotted(declared_return, vars(home))
    except Exception:  # noqa: BLE001 - an annotation that does not resolve says nothing
        declared_return = inspect.Signature.empty
    if isinstance(declared_return, type) and declared_return is not inspect.Signature.empty:
        returns = declared_return
    signature = inspect.Signature(params, return_annotation=returns)

    tool_class = _smolagents_tool_class()
    direct = tool_class is not None and isinstance(obj, tool_class)

    def call(**kwargs: Any) -> Any:
        if direct:
            # What smolagents' Tool.__call__ does for keyword arguments, without going through it: that is
            # where its instrumentation (openinference) opens a TOOL span, and the gate's span is this call's.
            if not obj.is_initialized:
                obj.setup()
            return obj.forward(**kwargs)
        return obj(**kwargs)

    call.__name__ = name
    call.__doc__ = description
    return ToolParts(name, description.strip(), call, fields, signature, docs,
                     output_type if isinstance(output_type, str) else None, obj)
