"""Python signatures from JSON Schemas: what a model is shown for a tool described by a schema.

An MCP tool (or any tool described by JSON Schema) is shown to models as a Python function. The
signature has to be faithful, or the model writes calls the schema refuses:

- nested objects become ``TypedDict`` classes (``class Address(TypedDict): street: str``), named
  after their ``title`` or the field holding them, with each field's description as a comment;
- a field that may be null is ``T | None``; one that is optional is ``T | None = None`` when it
  has no default (``None`` leaves it out), else ``T = <default>``;
- ``enum`` and ``const`` are ``Literal[...]``, arrays ``list[T]``, ``prefixItems`` ``tuple[...]``,
  maps (``additionalProperties``) ``dict[str, T]``, ``anyOf``/``oneOf`` unions, ``$ref`` to
  ``$defs`` resolved (a cycle is named, not followed);
- the return type comes from the output schema (FastMCP's ``{"result": …}`` wrapper unwrapped).

`render_signature` is the one function that does this; `MCPToolset` and code mode
(``proctor mcp serve``: ``describe_tool``) both use it. Schemas come from servers nobody here
trusts: rendering is bounded in depth and size and never raises on a strange schema (what cannot
be said precisely is ``Any``), and every text taken from a schema (descriptions, titles, enum and
default values, field names) is escaped by `proctor.termsafe.terminal_safe`, so no control
character, bidi override or invisible character of the server's reaches a model or a terminal.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proctor.termsafe import terminal_safe, text_safe

__all__ = ["Param", "Signature", "TypeText", "render_signature"]

_SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "null": "None"}
_MAX_DEPTH = 12
_MAX_TYPES = 64
_MAX_TEXT = 400


class TypeText:
    """An annotation that shows as the given text in `inspect.Signature` (``repr`` is the text)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TypeText) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


@dataclass(frozen=True)
class Param:
    """One parameter: its Python name, annotation text, whether required, default (as source text)."""

    name: str
    annotation: str
    required: bool
    default: str | None
    default_value: Any
    description: str
    nullable: bool


@dataclass
class Signature:
    """A tool's rendered signature: parameters, return type and the TypedDicts both refer to."""

    name: str
    params: list[Param]
    returns: str | None
    #: ``{class name: class source}``, in the order first used.
    types: dict[str, str] = field(default_factory=dict)
    #: True when the output schema is FastMCP's ``{"result": …}`` wrapper of a non-object result.
    wrapped_result: bool = False

    def def_line(self) -> str:
        """``name(a: str, b: int = 2) -> str``."""
        parts = []
        for p in self.params:
            parts.append(f"{terminal_safe(p.name)}: {p.annotation}" + ("" if p.required else f" = {p.default}"))
        ret = f" -> {self.returns}" if self.returns else ""
        return f"{self.name}({', '.join(parts)}){ret}"

    def source(self, description: str = "") -> str:
        """Python source a model can read: the TypedDicts, then the function with its docstring."""
        blocks = list(self.types.values())
        doc = text_safe(description.strip()).replace('"""', "'''")
        args = "".join(f"\n        {p.name}: {p.description}" for p in self.params if p.description)
        body = f'    """{doc}' + (f"\n\n    Args:{args}" if args else "") + '\n    """'
        blocks.append(f"def {self.def_line()}:\n{body}")
        return "\n\n".join(blocks)


def render_signature(name: str, input_schema: Mapping[str, Any] | None,
                     output_schema: Mapping[str, Any] | None = None) -> Signature:
    """The Python signature of a tool `name` taking `input_schema` and returning `output_schema`."""
    r = _Renderer(input_schema or {}, output_schema or {}, _camel(name))
    schema = input_schema if isinstance(input_schema, Mapping) else {}
    props = schema.get("properties")
    props = props if isinstance(props, Mapping) else {}
    required = schema.get("required")
    required_set = {x for x in required if isinstance(x, str)} if isinstance(required, list) else set()
    params: list[Param] = []
    for arg, prop in props.items():
        if not isinstance(arg, str):
            continue
        prop = prop if isinstance(prop, Mapping) else {}
        prop = r.deref(prop, r.input_root)
        text, nullable = r.type_of(prop, _camel(arg), r.input_root, 0)
        is_required = arg in required_set
        description = _one_line(prop.get("description") or prop.get("title") or "")
        if is_required:
            params.append(Param(arg, text, True, None, None, description, nullable))
            continue
        if "default" in prop:
            default = prop["default"]
            params.append(Param(arg, text, False, _shown(default), default, description, nullable))
        else:
            shown = text if nullable or text == "Any" else f"{text} | None"
            params.append(Param(arg, shown, False, "None", None, description, nullable))
    params.sort(key=lambda p: not p.required)  # Python wants the required ones first
    returns, wrapped = None, False
    out = output_schema if isinstance(output_schema, Mapping) else {}
    if out:
        out_props = out.get("properties")
        if isinstance(out_props, Mapping) and set(out_props) == {"result"} and out.get("type") in ("object", None):
            wrapped = True
            inner = out_props["result"] if isinstance(out_props["result"], Mapping) else {}
            returns = r.type_of(r.deref(inner, r.output_root), r.stem + "Result", r.output_root, 0)[0]
        else:
            returns = r.type_of(out, r.stem + "Result", r.output_root, 0)[0]
    return Signature(name, params, returns, r.types, wrapped)


def _camel(name: str) -> str:
    words = [w for w in re.split(r"[^0-9A-Za-z]+", name) if w]
    text = "".join(w[:1].upper() + w[1:] for w in words) or "Value"
    return text if text[0].isalpha() else "T" + text


def _singular(hint: str) -> str:
    """The class name for an item of a list held by `hint` (``Lines`` -> ``Line``)."""
    return hint[:-1] if len(hint) > 3 and hint.endswith("s") and not hint.endswith("ss") else hint + "Item"


def _one_line(text: Any) -> str:
    return terminal_safe(_clip(" ".join(str(text).split())))


def _shown(value: Any) -> str:
    """A schema's value (a default, an enum member) as Python source: its repr, escaped (a repr keeps some
    invisible characters, such as U+3164, as they are)."""
    return terminal_safe(_clip(repr(value)))


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_TEXT else text[:_MAX_TEXT] + "…"


class _Renderer:
    def __init__(self, input_root: Mapping[str, Any], output_root: Mapping[str, Any], stem: str) -> None:
        self.input_root, self.output_root, self.stem = input_root, output_root, stem
        self.types: dict[str, str] = {}
        self._by_id: dict[int, str] = {}
        self._in_progress: set[int] = set()

    def deref(self, schema: Mapping[str, Any], root: Mapping[str, Any], depth: int = 0) -> Mapping[str, Any]:
        ref = schema.get("$ref")
        if not isinstance(ref, str) or depth > _MAX_DEPTH:
            return schema
        m = re.fullmatch(r"#/(\$defs|definitions)/([^/]+)", ref)
        if m is None:
            return {}
        defs = root.get(m.group(1))
        target = defs.get(m.group(2)) if isinstance(defs, Mapping) else None
        if not isinstance(target, Mapping):
            return {}
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        merged.setdefault("title", m.group(2))
        return self.deref(merged, root, depth + 1)

    def type_of(self, schema: Mapping[str, Any], hint: str, root: Mapping[str, Any], depth: int) -> tuple[str, bool]:
        """(annotation text, whether null is allowed)."""
        if depth > _MAX_DEPTH:
            return "Any", False
        schema = self.deref(schema, root)
        if "const" in schema:
            return f"Literal[{_shown(schema['const'])}]", schema["const"] is None
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            values = [v for v in enum if v is not None]
            text = f"Literal[{terminal_safe(_clip(', '.join(repr(v) for v in values)))}]" if values else "None"
            nullable = len(values) < len(enum)
            return (f"{text} | None" if nullable and values else text), nullable
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                texts: list[str] = []
                nullable = False
                for i, option in enumerate(options[:16]):
                    if not isinstance(option, Mapping):
                        return "Any", False
                    t, n = self.type_of(option, hint if i == 0 else f"{hint}{i + 1}", root, depth + 1)
                    nullable = nullable or n or t == "None"
                    for part in t.split(" | "):
                        if part != "None" and part not in texts:
                            texts.append(part)
                if "Any" in texts:
                    return "Any", nullable
                text = " | ".join(texts) or "None"
                return (f"{text} | None" if nullable and texts else text), nullable
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], Mapping):
            return self.type_of(all_of[0], hint, root, depth + 1)
        kind = schema.get("type")
        if isinstance(kind, list):
            names = [k for k in kind if isinstance(k, str)]
            nullable = "null" in names
            texts = []
            for k in names:
                if k != "null":
                    texts.append(self.type_of({**schema, "type": k}, hint, root, depth + 1)[0])
            text = " | ".join(texts) or "None"
            return (f"{text} | None" if nullable and texts else text), nullable
        if schema.get("nullable") is True:  # OpenAPI's spelling, which some servers use
            inner = {k: v for k, v in schema.items() if k != "nullable"}
            return self.type_of(inner, hint, root, depth + 1)[0] + " | None", True
        if kind in _SCALARS:
            return _SCALARS[kind], kind == "null"
        if kind == "array":
            prefix = schema.get("prefixItems")
            if isinstance(prefix, list) and prefix and all(isinstance(p, Mapping) for p in prefix):
                parts = [self.type_of(p, f"{hint}Item{i + 1}", root, depth + 1)[0] for i, p in enumerate(prefix)]
                return f"tuple[{', '.join(parts)}]", False
            items = schema.get("items")
            if isinstance(items, Mapping) and items:
                return f"list[{self.type_of(items, _singular(hint), root, depth + 1)[0]}]", False
            return "list[Any]", False
        if kind == "object" or (kind is None and isinstance(schema.get("properties"), Mapping)):
            return self.object_of(schema, hint, root, depth), False
        return "Any", False

    def object_of(self, schema: Mapping[str, Any], hint: str, root: Mapping[str, Any], depth: int) -> str:
        props = schema.get("properties")
        if not isinstance(props, Mapping) or not props:
            extra = schema.get("additionalProperties")
            if isinstance(extra, Mapping) and extra:
                return f"dict[str, {self.type_of(extra, hint + 'Value', root, depth + 1)[0]}]"
            return "dict[str, Any]"
        key = id(schema)
        if key in self._by_id:
            return self._by_id[key]
        if key in self._in_progress or len(self.types) >= _MAX_TYPES:
            return "dict[str, Any]"
        title = schema.get("title")
        name = _camel(title) if isinstance(title, str) and title.strip() else hint
        if not name.isidentifier() or keyword.iskeyword(name):
            name = "T" + _camel(name)
        base, n = name, 2
        while name in self.types or name in ("Any", "Literal", "TypedDict", "NotRequired"):
            name, n = f"{base}{n}", n + 1
        self._in_progress.add(key)
        self.types[name] = ""  # keeps the name taken while its fields are rendered
        required = schema.get("required")
        required_set = {x for x in required if isinstance(x, str)} if isinstance(required, list) else set()
        lines = [f"class {name}(TypedDict):"]
        doc = schema.get("description")
        if isinstance(doc, str) and doc.strip():
            lines.append(f'    """{_one_line(doc).replace(chr(34) * 3, chr(39) * 3)}"""')
        for field_name, prop in list(props.items())[:64]:
            if not isinstance(field_name, str):
                continue
            prop = prop if isinstance(prop, Mapping) else {}
            text, _ = self.type_of(prop, _camel(field_name), root, depth + 1)
            if field_name not in required_set:
                text = f"NotRequired[{text}]"
            shown = terminal_safe(field_name if field_name.isidentifier() and not keyword.iskeyword(field_name)
                                  else repr(field_name))
            comment = self.deref(prop, root).get("description")
            line = f"    {shown}: {text}"
            if isinstance(comment, str) and comment.strip():
                line += f"  # {_one_line(comment)}"
            lines.append(line)
        self._in_progress.discard(key)
        self._by_id[key] = name
        del self.types[name]  # re-added last: the classes its fields use come first
        self.types[name] = "\n".join(lines)
        return name
