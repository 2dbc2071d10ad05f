"""The run says how it was isolated, and a policy can require bubblewrap (issue 34.2).

`proctor demo`, `proctor run` and the agents' summaries print ``sandbox: bubblewrap`` or ``sandbox: process
only (why)``; a policy's ``sandbox: required`` makes an Interpreter or a CodeAgent without a usable bubblewrap
refuse to start, with a one-line reason. Bubblewrap is taken away by PATH (the real probe runs: nothing is
stubbed), or replaced by a `bwrap` that cannot create a sandbox, as on a host that forbids user namespaces.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proctor import CodeAgent, Policy, ScriptedModel, ToolCallingAgent, tool
from proctor.errors import PolicyError, SandboxError
from proctor.gate import Gate
from proctor.interpreter import Interpreter
from proctor.interpreter.sandbox import bwrap_status
from proctor.testing import InMemoryAudit


@tool(side_effect="read")
def lookup(order: str) -> str:
    """Look an order up.

    Args:
        order: Order id.
    """
    return f"order {order}: shipped"


TOOLS = [lookup]
needs_bwrap = pytest.mark.skipif(not bwrap_status()[0], reason=f"bubblewrap unusable here: {bwrap_status()[1]}")

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = {"version": 1, "default": "allow", "sandbox": "required"}
NOT_INSTALLED = "process only (bubblewrap not installed: apt-get install bubblewrap)"


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    """No bwrap on PATH (checked on every probe, before any cached result)."""
    monkeypatch.setenv("PATH", "/nonexistent")


def _required_gate() -> Gate:
    return Gate(Policy.from_dict(REQUIRED), audit=InMemoryAudit(), tools=TOOLS)


def test_required_without_bubblewrap_refuses_the_interpreter(no_bwrap: None) -> None:
    """`sandbox: required` and no bwrap: SandboxError, one line naming the policy key and the install command."""
    with pytest.raises(SandboxError) as caught:
        Interpreter(TOOLS, _required_gate())
    message = str(caught.value)
    assert "\n" not in message and "`sandbox: required`" in message and "apt-get install bubblewrap" in message


def test_required_refuses_an_interpreter_asked_for_a_plain_process() -> None:
    """The policy is a floor: sandbox='process' on the Interpreter does not get round it."""
    with pytest.raises(SandboxError, match=r"`sandbox: required`.*sandbox='process' was asked for"):
        Interpreter(TOOLS, _required_gate(), sandbox="process")


def test_required_refuses_the_code_agent_before_any_run(no_bwrap: None) -> None:
    """A CodeAgent under `sandbox: required` without bubblewrap is refused when built, not mid-run."""
    with pytest.raises(SandboxError, match="apt-get install bubblewrap"):
        CodeAgent(TOOLS, ScriptedModel(["final_answer(1)"]), Policy.from_dict(REQUIRED))


@needs_bwrap
def test_required_with_bubblewrap_runs_under_it() -> None:
    """With a usable bubblewrap the requirement is met: the worker runs under it and says so."""
    with Interpreter(TOOLS, _required_gate()) as py:
        assert py.isolation == "bwrap" and py.sandbox_line == "bubblewrap"
        assert py.run("1 + 1").value == 2


def test_process_only_is_said_with_the_reason(no_bwrap: None) -> None:
    """Without bwrap, auto runs process-only and the interpreter's line gives the reason and the fix."""
    gate = Gate(Policy.from_dict({"version": 1, "default": "allow"}), audit=InMemoryAudit(), tools=TOOLS)
    with Interpreter(TOOLS, gate) as py:
        assert py.isolation == "process" and py.sandbox_line == NOT_INSTALLED
    with Interpreter(TOOLS, gate, sandbox="process") as py:
        assert py.sandbox_line == "process only (sandbox='process' was asked for)"


def test_the_agents_summaries_say_how_programs_ran(no_bwrap: None) -> None:
    """RunResult.sandbox and the summary table's sandbox row; a tool-calling agent says it runs no code."""
    from rich.console import Console

    from proctor.agent.render import summary_table

    policy = Policy.from_dict({"version": 1, "default": "allow"})
    program = "Thought: done.\n```python\nfinal_answer(lookup('A-1'))\n```"
    with CodeAgent(TOOLS, ScriptedModel([program]), policy) as agent:
        result = agent.run("look A-1 up")
    assert result.status == "done" and result.sandbox == NOT_INSTALLED
    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(summary_table(result))
    assert f"│ sandbox   │ {NOT_INSTALLED} │" in console.export_text()
    with ToolCallingAgent(TOOLS, ScriptedModel(["nothing to do"]), policy) as tca:
        assert tca.run("x").sandbox == "not used (a tool-calling agent runs no model-written code)"


def test_an_unknown_sandbox_mode_is_a_located_load_error() -> None:
    """`sandbox: requird` is refused at load with its line and column."""
    with pytest.raises(PolicyError, match=r"2:10: unknown sandbox 'requird' \(expected one of auto, required\)"):
        Policy.from_string("version: 1\nsandbox: requird\n")


def _demo(tmp_path: Path, path: str) -> str:
    env = {**os.environ, "PATH": path}
    proc = subprocess.run([sys.executable, "-m", "proctor.cli", "demo", "--audit", str(tmp_path / "a.jsonl")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_demo_says_process_only_when_bubblewrap_is_not_installed(tmp_path: Path) -> None:
    """`proctor demo` without bwrap on PATH: the banner and the summary say process only, and how to fix it."""
    out = _demo(tmp_path, str(tmp_path / "empty"))
    assert out.count("process only (bubblewrap not installed: apt-get install bubblewrap)") == 2


def test_demo_gives_the_real_reason_when_bubblewrap_cannot_run(tmp_path: Path) -> None:
    """A bwrap that is installed but cannot create a sandbox: its own reason is printed, not "not installed"."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    out = " ".join(_demo(tmp_path, f"{bin_dir}:/usr/bin:/bin").split())
    assert "process only (bwrap is installed but cannot create a sandbox here: bwrap: setting up uid" in out
    assert "not installed" not in out


@needs_bwrap
def test_demo_says_bubblewrap_when_it_runs(tmp_path: Path) -> None:
    """With bubblewrap usable, the demo's banner and summary say so."""
    out = _demo(tmp_path, os.environ["PATH"])
    assert "sandbox    bubblewrap" in out and "│ sandbox         │ bubblewrap" in out


def test_a_policy_reloaded_to_require_bubblewrap_stops_a_process_only_interpreter_before_its_next_program(
        tmp_path: Path) -> None:
    """The interpreter chose plain processes under the first policy; the file now says `sandbox: required`: its next
    program does not run (SandboxError naming the fix), and nothing the program would call is called."""
    from proctor.policy.reload import PolicySource

    path = tmp_path / "policy.yaml"
    path.write_text("version: 1\ndefault: allow\n")
    gate = Gate(PolicySource(path, check_every_ms=0), audit=InMemoryAudit(), tools=TOOLS)
    with Interpreter(TOOLS, gate, sandbox="process") as py:
        assert py.run("lookup('A-1')").value == "order A-1: shipped"
        fresh = tmp_path / "policy.new"
        fresh.write_text("version: 1\ndefault: allow\nsandbox: required\n")
        os.replace(fresh, path)
        time.sleep(0.01)
        result = py.run("lookup('A-2')")
    assert isinstance(result.error, SandboxError) and "`sandbox: required`" in str(result.error)
    assert [c.args for c in result.tool_calls] == []
