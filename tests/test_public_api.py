"""Tests for the public surface: the names DESIGN.md promises, and a complete __all__."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
from proctor_modules import PACKAGE_DIR, module_names

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


@pytest.mark.process
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


@pytest.mark.process
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


# -- what is public: these modules, exporting exactly these names; every other module is internal ----------

#: Each public module and its `__all__` (sorted). A module not listed here is internal: it may change or go
#: without notice, and nothing users read (README, docs, examples) imports it. docs/api.md lists the same.
PUBLIC: dict[str, str] = {
    "proctor": (
        "ApprovalDenied ApprovalTimeout AuditCorrupted AuditError AuditLog BudgetExceeded CallOutcome CallRecord "
        "CallRefused CallbackApprover CodeAgent ConsoleApprover Decision ExecutionResult ExecutionTimeout Gate "
        "InboxApprover Interpreter LiteLLMModel ModelResponse Policy PolicyError ProctorError RunContext RunInfo "
        "RunResult RunStore SandboxError ScriptedModel StepRecord StoreError Tool ToolCallingAgent ToolDenied "
        "ToolFailed WebhookApprover tool"
    ),
    "proctor.agent": (
        "AgentBase CallEvent CodeAgent CodeParseError FinalAnswerCheck LiteLLMModel Message Model ModelError "
        "ModelResponse RUN_STATUSES RunResult RunStatus ScriptedModel StepCallback StepRecord StreamEvent "
        "ToolCallRequest ToolCallingAgent Usage extract_code"
    ),
    "proctor.agent.render": (
        "DECISION_STYLE STATUS_STYLE StepPrinter calls_table decision_counts describe_image outcome_of print_run "
        "print_timeline summary_table when"
    ),
    "proctor.agent.replay": "ReplayedRun run_from_log run_from_records",
    "proctor.approval": (
        "ApprovalCallback ApprovalDecision ApprovalRequest Approver CallbackApprover ConsoleApprover Grant "
        "InboxApprover Verdict WebhookApprover approval_binding approver_from_spec"
    ),
    "proctor.audit": (
        "AuditLog AuditResult AuditSink CODES EMPTY_ROOT Failure GENESIS KINDS MerkleFrontier VerifyReport "
        "generate_keypair key_id load_private_key load_public_key merkle_root verify"
    ),
    "proctor.audit.base": "AuditReader AuditResult AuditSink AuditStartReader KINDS derive_key",
    "proctor.backends": (
        "AUDIT_KEY_ENV AuditFactory Backend KINDS Kind default_audit_path load_audit open_audit open_store register "
        "resolve scheme_of store_not_yet_made unregister"
    ),
    "proctor.calls": (
        "BudgetFigures BudgetHold Call CallPosition CallRecord CallStatus Decision HistoryEntry JSONValue OUTCOMES "
        "Outcome RunInfo SIDE_EFFECTS "
        "STATUSES SideEffect TrimmedHistory line_widths new_id side_effect_rank source_lines"
    ),
    "proctor.errors": (
        "AggregateError AmbiguousId ApprovalConflict ApprovalDenied ApprovalExpired ApprovalNotFound "
        "ApprovalTimeout AuditCorrupted AuditError BudgetExceeded CallRefused CodeParseError ConditionError "
        "ConfigurationError EncodeError EvaluationError ExecutionTimeout FinalAnswer FourEyes HaltError "
        "HaltRefused ImageError InterpreterError InvalidAnswer LedgerUnavailable LineError MCPToolFailed "
        "ManagedAgentError ModelError PolicyError PolicyIssue ProctorError ProgramError ProtocolError "
        "ReplayDiverged RunCancelled RunNotFound RunSuspended RunTakenOver SandboxError ScanFailure SignatureError "
        "SimulationError StepInterrupted StoreConflict StoreError StoreForged Terminated ToolDefinitionError "
        "ToolDenied ToolFailed ToolLoadError ToolOutcomeUnknown ToolsetError Unresolved ValueTooDeep WorkerDied"
    ),
    "proctor.gate": "CallOutcome CallScope Gate PolicyLike RunContext agent_fields",
    "proctor.halt": (
        "DEFAULT_GRACE_S DEFAULT_REFRESH_S HALT_SIGNAL Halt HaltBackend HaltChannel HaltError HaltEvent "
        "HaltListener HaltsAt JointHalts MAX_REFRESH_S MemoryHalts OUTAGE_ID PolledHalts SCOPES Scope SharesHalts "
        "gate_halts halt_refusal install_signal_halt new_halt operator"
    ),
    "proctor.integrations.mcp": "MCPTool MCPToolFailed MCPToolset SUPPORTED_MCP side_effect_of",
    "proctor.integrations.smolagents": (
        "GovernedExecutor GovernedTool MCPClientTool SmolagentsAgentTool govern govern_tools mcp_client_tools"
    ),
    "proctor.interpreter": "ExecutionResult Interpreter ProgramError",
    "proctor.ledger": (
        "Claim Lease LedgerScope MemoryLedger PoolUsage SharedLedger default_ledger ledger_scope open_ledger"
    ),
    "proctor.policy": "ApprovalSettings Ledger Policy Reservation ToolFacts",
    "proctor.policy.functions": (
        "BOX_PREFIX CelFunction FUNCTIONS NATIVE_FUNCTIONS PROVENANCE_FUNCTIONS RECORD_FUNCTIONS boxed cel_sum "
        "email_domain known_functions normalize path_normalize path_within register"
    ),
    "proctor.policy.reload": "DEFAULT_CHECK_EVERY_MS PolicyChange PolicyRefused PolicySource",
    "proctor.policy.simulate": "RAN_STATUSES RecordedRun Simulation SimulationError complete_history decide_like_gate",
    "proctor.store": (
        "APPROVAL_STATES AnswerSeal ApprovalAnswer ApprovalState JournalEntry PendingApproval RUN_STATES RunRecord "
        "RunState RunStore register_scheme"
    ),
    "proctor.telemetry": (
        "AgentSpan ApprovalSpan StepSpan ToolSpan agent_span approval_span bind_call bind_run capture_content "
        "configure_logging configure_tracing current_context get_tracer set_capture_content span_ids step_span "
        "tool_span"
    ),
    "proctor.telemetry.logging": "add_otel_ids bind_call bind_run configure_logging get_logger",
    "proctor.telemetry.setup": "OtlpProtocol Telemetry configure_tracing current resolve_endpoint shutdown",
    "proctor.testing": "InMemoryAudit ModelResponse ScriptedModel SpanCapture",
    "proctor.tools": "Tool ToolDefinitionError as_tool run_with_timeout tool",
}

ROOT = PACKAGE_DIR.parent
_IMPORT = re.compile(r"^\s*(?:from\s+(proctor(?:\.\w+)*)\s+import|import\s+(proctor(?:\.\w+)*))", re.M)


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_each_public_module_exports_exactly_its_listed_names(module: str) -> None:
    """Adding, renaming or removing a public name is a decision made here, in review, not by accident."""
    assert sorted(importlib.import_module(module).__all__) == PUBLIC[module].split()


def test_every_public_module_exists() -> None:
    assert set(PUBLIC) <= set(module_names())


def _user_facing_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").rglob("*.py"))]


def test_what_users_read_imports_only_public_modules() -> None:
    """README, docs and examples teach only public modules: an internal one they import would have to become public."""
    internal = []
    for path in _user_facing_files():
        for match in _IMPORT.finditer(path.read_text(encoding="utf-8")):
            module = match.group(1) or match.group(2)
            if module not in PUBLIC:
                internal.append(f"{path.relative_to(ROOT)}: {module}")
    assert internal == []


def test_docs_api_lists_the_public_modules() -> None:
    """docs/api.md names the same public modules as this test, one table row each."""
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| `(proctor(?:\.\w+)*)` \|", text, re.M)
    assert sorted(listed) == sorted(PUBLIC)
