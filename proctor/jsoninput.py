"""JSON from people and models (command-line options, console edits, tool-call arguments), bounded.

`json.loads` recurses once per nesting level: 50,000 ``[`` end in a `RecursionError`
that escapes every ``except ValueError``. `loads_bounded` measures size and depth
first, in one pass over the text that skips strings, and refuses with a located
`ConfigurationError` (a `ValueError`): ``--args:1:65: JSON nested deeper than 64 levels``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from proctor.errors import ConfigurationError

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

__all__ = ["MAX_JSON_INPUT_BYTES", "MAX_JSON_INPUT_DEPTH", "loads_bounded", "local_schema_validator", "shape_problem"]

MAX_JSON_INPUT_DEPTH = 64
MAX_JSON_INPUT_BYTES = 4 << 20

# A JSON string (with its escapes) or one bracket: strings are skipped whole, so a
# bracket inside one is not counted.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.DOTALL)


def _where(text: str, index: int) -> str:
    line = text.count("\n", 0, index) + 1
    return f"{line}:{index - (text.rfind(chr(10), 0, index) + 1) + 1}"


def shape_problem(text: str, what: str = "JSON", *, max_depth: int = MAX_JSON_INPUT_DEPTH,
                  max_bytes: int = MAX_JSON_INPUT_BYTES) -> str | None:
    """Why `text` is too big or too deeply nested to parse (``WHAT:LINE:COLUMN: …``), or None."""
    if len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        return f"{what}:1:1: JSON input over {max_bytes} bytes; pass less"
    depth = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth > max_depth:
                return f"{what}:{_where(text, match.start())}: JSON nested deeper than {max_depth} levels; flatten it"
        elif token in ("]", "}"):
            depth -= 1
    return None


def loads_bounded(text: str, what: str = "JSON", *, max_depth: int = MAX_JSON_INPUT_DEPTH,
                  max_bytes: int = MAX_JSON_INPUT_BYTES) -> Any:
    """`json.loads(text)`, refusing text over `max_bytes` or nested deeper than `max_depth`.

    Every refusal — too big, too deep, not JSON — is a `ConfigurationError` whose message
    starts with ``WHAT:LINE:COLUMN:``.
    """
    problem = shape_problem(text, what, max_depth=max_depth, max_bytes=max_bytes)
    if problem is not None:
        raise ConfigurationError(problem)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{what}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
    except RecursionError:  # pragma: no cover - the depth check comes first; kept as a last guard
        raise ConfigurationError(f"{what}:1:1: JSON nested too deeply; flatten it") from None


def local_schema_validator(schema: Mapping[str, Any], draft: type[Validator] | None = None) -> Validator:
    """A jsonschema validator for `schema` (of `draft`, else the one its ``$schema`` names) that resolves a
    ``$ref`` only within the schema itself and the JSON Schema meta-schemas.

    jsonschema's default fetches any other reference over the network (``http://…``, or one relative to a
    remote ``$id``), and a tool's schema is often someone else's (an MCP server's): it would aim proctor's
    process at an internal host. Validating against such a reference raises
    `referencing.exceptions.Unresolvable` (its ``ref`` names it). Needs jsonschema (ImportError otherwise).
    """
    import jsonschema
    from referencing import Registry

    kind = draft if draft is not None else jsonschema.validators.validator_for(schema)
    return kind(schema, registry=Registry())
