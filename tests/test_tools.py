"""Tests for proctor.tools: schemas from signatures and docstrings, validation."""

from __future__ import annotations

from typing import Annotated

import pydantic
import pytest
from annotated_types import Gt

from proctor.errors import ToolDenied
from proctor.tools import Tool, ToolDefinitionError, tool


@tool(side_effect="external", cost=1)
def send_email(to: str, subject: str, body: str = "") -> str:
    """Send an email.

    Args:
        to: Recipient address.
        subject: Subject line.
        body: Plain-text body,
            which may run on.

    Returns:
        A message id.
    """
    return f"sent to {to}"


def test_schema_comes_from_signature_and_docstring() -> None:
    """The JSON schema names each parameter with its type, description and default."""
    assert send_email.name == "send_email"
    assert send_email.description == "Send an email."
    assert send_email.side_effect == "external"
    assert send_email.cost == 1
    props = send_email.parameters["properties"]
    assert props["to"] == {"type": "string", "description": "Recipient address."}
    assert props["body"] == {"type": "string", "description": "Plain-text body, which may run on.", "default": ""}
    assert send_email.parameters["required"] == ["to", "subject"]
    assert send_email.parameters["additionalProperties"] is False


def test_json_schema_is_openai_function_shape() -> None:
    """json_schema() is what litellm's tools= expects."""
    spec = send_email.json_schema()
    assert spec["type"] == "function"
    assert spec["function"]["name"] == "send_email"
    assert spec["function"]["parameters"]["properties"]["subject"]["type"] == "string"


def test_signature_text() -> None:
    """The signature shown to a model includes defaults and the return type."""
    assert send_email.signature_text() == "send_email(to: str, subject: str, body: str = '') -> str"


def test_validate_fills_defaults_and_coerces() -> None:
    """Valid arguments come back complete."""
    assert send_email.validate({"to": "a@example.com", "subject": "hi"}) == {
        "to": "a@example.com",
        "subject": "hi",
        "body": "",
    }


@tool(side_effect="read")
def plain(s: str, i: int, f: float, b: bool = False) -> str:
    """Take one of each plain type.

    Args:
        s: A string.
        i: An int.
        f: A float.
        b: A flag.
    """
    return s


class _Str(str):
    pass


@pytest.mark.parametrize("args", [
    {"s": "x", "i": 1, "f": 1.5, "b": True},
    {"b": False, "f": -0.0, "i": 10**400, "s": "\ud800 é"},  # another order, a huge int, a lone surrogate
    {"s": "x", "i": 1, "f": float("nan"), "b": True},
    {"s": "x", "i": True, "f": 1, "b": 1},  # lax conversions: not exact types, so pydantic's answer
    {"s": _Str("x"), "i": 1, "f": 1.0, "b": True},
    {"s": "x", "i": 1, "f": 1.0},  # a default left out
])
def test_validate_shortcut_returns_what_pydantic_returns(args: dict[str, object]) -> None:
    """For plain-typed parameters, validate gives pydantic's values and types, in signature order."""
    assert plain._plain_args == (("s", str), ("i", int), ("f", float), ("b", bool))
    got = plain.validate(args)
    assert plain._validator is not None
    want = dict(plain._validator.validate_python(dict(args)).__dict__)
    assert list(got) == list(want) == ["s", "i", "f", "b"]
    assert [type(v) for v in got.values()] == [type(v) for v in want.values()]
    assert repr(got) == repr(want) and got is not args


def test_validate_shortcut_refuses_as_pydantic_does() -> None:
    """An extra or missing argument, or a wrong type, is refused by the full validation's message."""
    for bad, says in [({"s": "x", "i": 1, "f": 1.0, "z": 1}, "unexpected argument 'z'"),
                      ({"s": "x", "f": 1.0, "b": True}, "missing argument 'i'"),
                      ({"s": 3, "i": 1, "f": 1.0, "b": True}, "argument 's'")]:
        with pytest.raises(ToolDenied, match=says):
            plain.validate(bad)
    assert send_email._plain_args is not None and Tool.from_function(_optional)._plain_args is None


def _optional(n: int | None) -> int:
    """Take an int or None.

    Args:
        n: A number.
    """
    return n or 0


def test_validate_names_the_argument_and_what_was_expected() -> None:
    """An invalid call is refused naming each bad argument."""
    with pytest.raises(ToolDenied) as info:
        send_email.validate({"to": 3, "subjct": "x"})
    message = str(info.value)
    assert "argument 'to': Input should be a valid string (got 3)" in message
    assert "missing argument 'subject'" in message
    assert "unexpected argument 'subjct'" in message


@tool(side_effect="write")
def refund(order: Annotated[str, pydantic.Field(pattern=r"^A-[0-9]+$")],
           cents: Annotated[int, pydantic.Field(gt=0, le=10_000)],
           reason: Annotated[str, pydantic.Field(max_length=20)] = "", times: Annotated[int, Gt(0)] = 1) -> str:
    """Refund an order.

    Args:
        order: Order id.
        cents: Amount.
        reason: Why.
        times: How often.
    """
    return "refunded"


@pytest.mark.parametrize("args", [
    {"order": "A-1", "cents": -500},
    {"order": "A-1", "cents": 10_001},
    {"order": "B-1", "cents": 5},
    {"order": "A-1", "cents": 5, "reason": "x" * 21},
    {"order": "A-1", "cents": 5, "times": 0},
])
def test_annotated_constraints_are_enforced(args: dict[str, object]) -> None:
    """Constraints written with Annotated (pydantic Field, annotated-types) refuse a call that breaks them."""
    with pytest.raises(ToolDenied, match="invalid call to refund: argument"):
        refund.validate(args)


def test_annotated_constraints_reach_the_schema_but_not_the_signature() -> None:
    """The model sees the constraints in the JSON schema and plain types in the signature."""
    assert refund.parameters["properties"]["cents"]["exclusiveMinimum"] == 0
    assert refund.parameters["properties"]["cents"]["maximum"] == 10_000
    assert refund.parameters["properties"]["order"]["pattern"] == "^A-[0-9]+$"
    assert str(refund.signature) == "(order: str, cents: int, reason: str = '', times: int = 1) -> str"
    assert refund.validate({"order": "A-7", "cents": 5}) == {"order": "A-7", "cents": 5, "reason": "", "times": 1}


def test_bind_maps_positional_arguments() -> None:
    """Positional arguments are mapped onto parameter names as Python would."""
    assert send_email.bind(("a", "b"), {"body": "c"}) == {"to": "a", "subject": "b", "body": "c"}
    with pytest.raises(ToolDenied, match="too many positional arguments"):
        send_email.bind(("a", "b", "c", "d"))


def test_calling_the_tool_directly_runs_the_function() -> None:
    """A Tool stays callable, ungoverned, for the owner's own tests."""
    assert send_email("x", "y") == "sent to x"


def test_missing_docstring_is_an_error() -> None:
    """A tool without a docstring cannot be described to a model."""

    def f(x: int) -> int:
        return x

    with pytest.raises(ToolDefinitionError, match="has no docstring"):
        tool(f)


def test_missing_type_is_an_error() -> None:
    """An untyped parameter is refused at decoration time."""

    def f(x):  # type: ignore[no-untyped-def]
        """Do.

        Args:
            x: thing.
        """

    with pytest.raises(ToolDefinitionError, match="parameter 'x' has no type annotation"):
        tool(f)


def test_missing_args_entry_is_an_error() -> None:
    """A parameter absent from Args: is refused at decoration time."""

    def f(x: int, y: int) -> int:
        """Do.

        Args:
            x: thing.
        """
        return x

    with pytest.raises(ToolDefinitionError, match="parameter 'y' is not described"):
        tool(f)


def test_args_entry_for_unknown_parameter_is_an_error() -> None:
    """Args: describing a parameter that does not exist is a typo worth reporting."""

    def f(x: int) -> int:
        """Do.

        Args:
            x: thing.
            z: not a parameter.
        """
        return x

    with pytest.raises(ToolDefinitionError, match="unknown parameter"):
        tool(f)


def test_unknown_side_effect_is_an_error() -> None:
    """The side-effect class must be one of the five."""

    def f(x: int) -> int:
        """Do.

        Args:
            x: thing.
        """
        return x

    with pytest.raises(ToolDefinitionError, match="unknown side_effect 'extrnal'"):
        Tool.from_function(f, side_effect="extrnal")  # type: ignore[arg-type]


def test_var_args_are_refused() -> None:
    """*args cannot be described in a JSON schema."""

    def f(*xs: int) -> int:
        """Do.

        Args:
            xs: things.
        """
        return 0

    with pytest.raises(ToolDefinitionError, match=r"\*xs"):
        tool(f)


def test_async_tool_is_detected() -> None:
    """An async function becomes an async tool."""

    @tool(side_effect="read")
    async def fetch(url: str) -> str:
        """Fetch a page.

        Args:
            url: Address.
        """
        return url

    assert fetch.is_async


def test_positional_only_parameters_are_passed_by_position() -> None:
    """invoke() calls a tool with positional-only parameters correctly."""

    @tool(side_effect="none")
    def add(a: int, b: int, /, scale: int = 1) -> int:
        """Add two numbers.

        Args:
            a: First.
            b: Second.
            scale: Multiplier.
        """
        return (a + b) * scale

    assert add.invoke(add.validate({"a": 1, "b": 2, "scale": 3})) == 9
