"""The surface integrators see: keyword-only constructors and one error tree with builtin bases kept."""

from __future__ import annotations

import inspect

import pytest

import proctor.approval
from proctor import CodeAgent, Gate, Interpreter, Policy, ProctorError, ScriptedModel, ToolCallingAgent, tool
from proctor.audit.log import AuditLog
from proctor.audit.postgres import PostgresAuditLog
from proctor.errors import ConfigurationError, ModelError, ToolDefinitionError

POLICY = Policy.from_dict({"version": 1, "default": "allow"})


def _positional(cls: type) -> list[str]:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def test_constructors_take_only_their_first_arguments_by_position() -> None:
    """Everything after the first few arguments of each constructor is keyword-only."""
    assert _positional(Gate) == ["policy"]
    assert _positional(Interpreter) == ["tools", "gate"]
    assert _positional(CodeAgent) == ["tools", "model", "policy"]
    assert _positional(ToolCallingAgent) == ["tools", "model", "policy"]


def test_a_fourth_positional_argument_is_refused() -> None:
    """CodeAgent and ToolCallingAgent refuse the same positional slot the same way."""
    for cls in (CodeAgent, ToolCallingAgent):
        with pytest.raises(TypeError):
            cls([], ScriptedModel([]), POLICY, None)  # type: ignore[misc]


def test_tool_definition_error_is_a_proctor_error_and_a_type_error() -> None:
    """A function that cannot be a tool raises an error catchable both ways."""

    def undocumented(x: int) -> int:
        return x

    with pytest.raises(ToolDefinitionError) as info:
        tool(undocumented)
    assert isinstance(info.value, ProctorError) and isinstance(info.value, TypeError)


def test_model_error_is_a_proctor_error_and_a_runtime_error() -> None:
    """A model that cannot answer raises a ProctorError that is still a RuntimeError."""
    with pytest.raises(ModelError) as info:
        ScriptedModel([]).generate([{"role": "user", "content": "hi"}])
    assert isinstance(info.value, ProctorError) and isinstance(info.value, RuntimeError)


def test_registering_a_second_tool_under_a_taken_name_is_a_configuration_error() -> None:
    """Gate.register's name clash is a ProctorError that is still a ValueError."""

    @tool
    def lookup(q: str) -> str:
        """Look up.

        Args:
            q: Query.
        """
        return q

    def other(q: str) -> str:
        """Look up otherwise.

        Args:
            q: Query.
        """
        return q

    gate = Gate(POLICY, tools=[lookup])
    with pytest.raises(ConfigurationError, match="already registered") as info:
        gate.register(tool(name="lookup")(other))
    assert isinstance(info.value, ProctorError) and isinstance(info.value, ValueError)


def test_bad_constructor_values_are_configuration_errors() -> None:
    """A bad sandbox name or max_steps is a ProctorError a caller may still catch as ValueError."""
    with pytest.raises(ConfigurationError, match="sandbox must be"):
        Interpreter([], Gate(POLICY), sandbox="docker")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_steps"):
        CodeAgent([], ScriptedModel([]), POLICY, max_steps=0)


# -- AuditLog and the approvers: one obvious argument at most, the rest by keyword (pydantic-ai style) --

APPROVERS = [getattr(proctor.approval, name) for name in proctor.approval.__all__
             if name.endswith("Approver") and name != "Approver"]  # Approver: the Protocol they implement


def test_every_approver_is_checked() -> None:
    names = {cls.__name__ for cls in APPROVERS}
    assert {"ConsoleApprover", "WebhookApprover", "CallbackApprover", "InboxApprover"} <= names


@pytest.mark.parametrize(("cls", "first"), [
    (AuditLog, ["path"]), (PostgresAuditLog, ["url"]),
    *((cls, None) for cls in APPROVERS),
], ids=lambda v: v.__name__ if isinstance(v, type) else str(v))
def test_at_most_the_first_parameter_is_positional(cls: type, first: list[str] | None) -> None:
    taken = _positional(cls)
    assert len(taken) <= 1, f"{cls.__name__}({', '.join(taken)}, …): make all after the first keyword-only"
    if first is not None:
        assert taken == first


def test_a_second_positional_argument_is_refused() -> None:
    """AuditLog("audit.jsonl", "audit.key") is a TypeError: the key is named (signing_key=)."""
    with pytest.raises(TypeError):
        AuditLog("audit.jsonl", "audit.key")  # type: ignore[misc]
    with pytest.raises(TypeError):
        proctor.approval.WebhookApprover("https://x.example/approve", "secret")  # type: ignore[misc]
