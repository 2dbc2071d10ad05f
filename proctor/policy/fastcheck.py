"""Validate a policy file without importing pydantic: what makes `proctor policy check` start fast.

Importing pydantic and building the policy models takes ~200 ms of a ~440 ms `proctor policy
check` (issue #18.5). The check does not need the models, only their validation: so the
models' core schema (what pydantic compiles them to, and what `pydantic_core` runs) is
generated once from `proctor.policy.schema` into `proctor.policy._core_schema`, with every
check a function of `proctor.policy.validators` (the same functions the models run) and each
model replaced by a plain `Record` class of the same name and fields. `validate` runs that
schema in `pydantic_core`: the same checks in the same order, the same errors (so the loader
locates them the same way), and records whose attributes are the models' fields.

A core schema is read by the pydantic-core release that wrote it: with any other release
installed, `validate` uses the models themselves (the same result, at pydantic's start-up cost).

The schema module is generated, never edited: after changing `proctor.policy.schema` or
`proctor.policy.validators`, or upgrading pydantic, run ``python -m proctor.policy.fastcheck --write``
(tests/policy/test_fastcheck.py fails while it is stale).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from proctor.policy import validators

if TYPE_CHECKING:
    from pydantic_core import SchemaValidator

    from proctor.policy.schema import PolicyModel

__all__ = ["RECORDS", "Record", "generate", "usable", "validate"]

GENERATED = Path(__file__).with_name("_core_schema.py")


class Record:
    """A validated part of a policy file: its fields as attributes, like the model of the same name."""

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        """The fields as plain data, as the model's ``model_dump(mode="python")`` gives them."""
        return {k: _dump(v) for k, v in vars(self).items() if not k.startswith("__")}

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("__"))
        return f"{type(self).__name__}({fields})"


def _dump(value: Any) -> Any:
    if isinstance(value, Record):
        return value.model_dump()
    if isinstance(value, tuple):
        return tuple(_dump(v) for v in value)
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


def _record_classes() -> dict[str, type[Record]]:
    from proctor.policy._core_schema import FIELDS

    # A model's plain methods and properties live in a mixin both share (BudgetSpec: shared, label_key).
    mixins: dict[str, tuple[type, ...]] = {"BudgetSpec": (validators.BudgetScope,)}
    return {name: type(name, (Record, *mixins.get(name, ())), {"__module__": __name__}) for name in FIELDS}


#: The record class standing for each model, by the model's name.
RECORDS: dict[str, type[Record]] = _record_classes()


def _default(name: str, fields: Mapping[str, Any]) -> Callable[[], Record]:
    """A default factory giving the record of model `name` with `fields` (the model's defaults)."""

    def make() -> Record:
        record = RECORDS[name].__new__(RECORDS[name])
        vars(record).update(fields)
        return record

    return make


@functools.cache
def _validator() -> SchemaValidator:
    from pydantic_core import SchemaValidator

    from proctor.policy._core_schema import core_schema

    return SchemaValidator(core_schema(RECORDS, _default))


@functools.cache
def usable() -> bool:
    """Whether the installed pydantic-core is the release the schema was generated with."""
    from pydantic_core import __version__

    from proctor.policy._core_schema import PYDANTIC_CORE_VERSION

    return bool(__version__ == PYDANTIC_CORE_VERSION)


def validate(data: Any) -> PolicyModel:
    """`PolicyModel.model_validate(data)` without pydantic: raises pydantic_core's ValidationError with the
    same errors; returns a `Record` tree with the model's fields (typed as the model it stands for).
    With another pydantic-core than the schema's, the model itself validates (see the module docstring)."""
    if not usable():
        from proctor.policy.schema import PolicyModel

        return PolicyModel.model_validate(data)
    return _validator().validate_python(data)  # type: ignore[no-any-return]


# -- generating proctor/policy/_core_schema.py (imports pydantic) ------------------------------------------


class _Source:
    """A value printed as Python source (pprint prints its repr)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _convert(node: Any, key: str = "") -> Any:
    from pydantic import BaseModel

    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k in ("metadata", "serialization"):
                continue  # JSON Schema and serialisation hooks: not validation
            out[k] = _convert(v, k)
        return out
    if isinstance(node, list):
        return [_convert(v, key) for v in node]
    if isinstance(node, tuple):
        return tuple(_convert(v, key) for v in node)
    if key in ("ref", "schema_ref") and isinstance(node, str):
        return node.rsplit(".", 1)[-1].split(":")[0]  # 'proctor.policy.schema.MatchSpec:9424…' -> 'MatchSpec'
    if key == "cls" and isinstance(node, type) and issubclass(node, BaseModel):
        return _Source(f"records[{node.__name__!r}]")
    if key == "default_factory" and isinstance(node, type) and issubclass(node, BaseModel):
        defaults = node().model_dump()
        if any(isinstance(v, (dict, list, tuple)) and v for v in defaults.values()):
            raise TypeError(f"{node.__name__}: a default factory with nested defaults is not supported here")
        return _Source(f"default({node.__name__!r}, {defaults!r})")
    if node is dict or node is list or node is tuple:
        return _Source(node.__name__)
    if isinstance(node, validators.Choice):
        return _Source(f"V.{node!r}")
    if callable(node):
        name = getattr(node, "__name__", "")
        if getattr(node, "__module__", None) != validators.__name__ or getattr(validators, name, None) is not node:
            raise TypeError(f"{node!r}: a policy check must be a function of proctor.policy.validators "
                            "(the fast check imports it from there)")
        return _Source(f"V.{name}")
    if node is None or isinstance(node, (str, int, float, bool)):
        return node
    raise TypeError(f"cannot write {node!r} ({type(node).__name__}) into the generated core schema")


def generate() -> str:
    """The source of proctor/policy/_core_schema.py, from `proctor.policy.schema`'s models."""
    import pprint

    import pydantic_core

    from proctor.policy import schema

    models = ("PolicyModel", "ToolSpec", "SourcesSpec", "CallLabels", "FieldChoice", "MatchSpec", "LimitSpec",
              "BudgetSpec", "RuleSpec", "ApprovalSpec", "ApproversSpec", "OsUserSpec")
    fields = {name: tuple(getattr(schema, name).model_fields) for name in models}
    body = pprint.pformat(_convert(schema.PolicyModel.__pydantic_core_schema__), width=116, sort_dicts=False)
    return (
        '"""The core schema of proctor.policy.schema.PolicyModel, for `proctor.policy.fastcheck`.\n\n'
        "GENERATED by `python -m proctor.policy.fastcheck --write` from the pydantic models: do not edit.\n"
        '"""\n\n'
        "# ruff: noqa: E501\n"
        "from __future__ import annotations\n\n"
        "from collections.abc import Callable, Mapping\n"
        "from typing import Any\n\n"
        "from proctor.policy import validators as V\n\n"
        '__all__ = ["FIELDS", "PYDANTIC_CORE_VERSION", "core_schema"]\n\n'
        "#: The pydantic-core release that wrote this schema (and the only one that reads it here).\n"
        f"PYDANTIC_CORE_VERSION = {pydantic_core.__version__!r}\n\n"
        "#: Each model's fields, in order.\n"
        f"FIELDS: dict[str, tuple[str, ...]] = {pprint.pformat(fields, width=116, sort_dicts=False)}\n\n\n"
        "def core_schema(records: Mapping[str, type], default: Callable[[str, dict[str, Any]], Any]) -> "
        "dict[str, Any]:\n"
        '    """The schema, with `records[name]` for each model class and `default(name, fields)` for a model\'s '
        'default factory."""\n'
        "    return " + body.replace("\n", "\n" + " " * 11) + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m proctor.policy.fastcheck --write`` regenerates the schema module; ``--check`` says if it is stale."""
    args = sys.argv[1:] if argv is None else argv
    text = generate()
    if args == ["--write"]:
        GENERATED.write_text(text)
        print(f"wrote {GENERATED}")
        return 0
    if args == ["--check"]:
        current = GENERATED.read_text() == text
        print(f"{GENERATED}: {'current' if current else 'stale: run python -m proctor.policy.fastcheck --write'}")
        return 0 if current else 1
    print("usage: python -m proctor.policy.fastcheck --write | --check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
