"""Tests for the public surface: the names DESIGN.md promises, and a complete __all__."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys

import proctor
import proctor.errors

CONTRACT = [
    "tool", "Tool", "Policy", "Gate", "Interpreter", "CodeAgent", "ToolCallingAgent", "LiteLLMModel",
    "ScriptedModel", "AuditLog", "ConsoleApprover", "WebhookApprover", "CallbackApprover",
]
ERRORS = [
    "ToolDenied", "ApprovalDenied", "ApprovalTimeout", "BudgetExceeded", "ToolFailed", "PolicyError",
    "AuditError", "AuditCorrupted", "ExecutionTimeout", "SandboxError", "ProctorError",
]


def test_contract_names_are_importable_from_proctor() -> None:
    """Every name of DESIGN.md §3 imports from the top-level package."""
    for name in CONTRACT + ERRORS:
        assert name in proctor.__all__, name
        assert getattr(proctor, name) is not None


def test_errors_are_the_same_objects_everywhere() -> None:
    """proctor.X and proctor.errors.X are one class."""
    for name in ERRORS:
        assert getattr(proctor, name) is getattr(proctor.errors, name)


def test_top_level_all_is_complete() -> None:
    """Every public class or function of proctor (imported or exported lazily) is listed in __all__."""
    for name in proctor.__all__:
        getattr(proctor, name)  # resolve every lazy export
    public = {
        n for n, o in vars(proctor).items()
        if not n.startswith("_") and (inspect.isclass(o) or inspect.isfunction(o))
    }
    assert public == set(proctor.__all__)
    assert set(proctor.__all__) <= set(dir(proctor))


def test_import_proctor_imports_no_heavy_dependency() -> None:
    """`import proctor` loads no CEL, rich, cryptography, pydantic, agent or OpenTelemetry code (PEP 562 exports)."""
    code = "import sys, proctor; print(' '.join(sorted(sys.modules)))"
    loaded = set(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
                 .stdout.split())
    heavy = {"cel", "rich", "cryptography", "pydantic", "yaml", "opentelemetry", "structlog", "litellm",
             "proctor.agent", "proctor.policy", "proctor.gate", "proctor.audit"}
    assert not {m for m in loaded if m.split(".")[0] in heavy or m in heavy}


def test_lazy_export_is_the_defining_object() -> None:
    """A lazily exported name is the very object its module defines, also where a submodule shares its name."""
    import proctor.audit
    import proctor.audit.verify
    from proctor.audit import verify
    from proctor.gate import Gate

    assert proctor.Gate is Gate
    assert callable(verify) and verify.__module__ == "proctor.audit.verify"


def test_every_module_declares_all() -> None:
    """Each module of the package states its public names, and each listed name exists."""
    for info in pkgutil.walk_packages(proctor.__path__, "proctor."):
        if info.name.endswith("__main__") or ".demo." in info.name:
            continue
        module = importlib.import_module(info.name)
        names = getattr(module, "__all__", None)
        assert names is not None, f"{info.name} has no __all__"
        for name in names:
            assert hasattr(module, name), f"{info.name}.__all__ lists missing {name}"


def test_cli_help_imports_no_heavy_dependency() -> None:
    """`proctor --help` builds its parser without CEL's native module, its CLI, pydantic, rich or OpenTelemetry."""
    code = "import sys; from proctor.cli import build_parser; build_parser(); print(' '.join(sorted(sys.modules)))"
    loaded = set(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
                 .stdout.split())
    heavy = {"cel.cel", "cel.cli", "prompt_toolkit", "typer", "rich", "cryptography", "pydantic", "yaml",
             "opentelemetry", "litellm", "fastapi"}
    assert not {m for m in loaded if m in heavy or m.split(".")[0] in heavy - {"cel.cel", "cel.cli"}}


def test_cli_command_table_names_what_each_module_registers() -> None:
    """`proctor.cli.COMMANDS` maps each command to the module registering it, so `proctor X` imports only X's module."""
    import argparse

    from proctor.cli import COMMANDS, build_parser

    for module in set(COMMANDS.values()):
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(module).register(sub)
        assert set(sub.choices) == {c for c, m in COMMANDS.items() if m == module}
    assert set(build_parser()._subparsers._group_actions[0].choices) == set(COMMANDS)  # type: ignore[union-attr]
    assert set(build_parser("policy")._subparsers._group_actions[0].choices) == {"policy"}  # type: ignore[union-attr]
