"""Tests of `proctor run`: a real run over litellm against a local server, and usage errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from proctor.cli import main

from .openai_server import completion, serve, tool_call

# `proctor run` as a process: each run starts its agent's sandboxed worker (tests/conftest.py, tiers).
pytestmark = pytest.mark.sandbox

ROOT = Path(__file__).resolve().parents[2]
SUPPORT_POLICY = str(ROOT / "examples" / "policies" / "support.yaml")
PROGRAM = '''Thought: read the ticket, refund the small order.
```python
t = get_ticket("T-100")
order = get_order(t["order_id"])
ref = issue_refund(order_id=order["id"], amount=order["total"])
final_answer(f"refunded {order['total']} ({ref})")
```'''


def _proctor(*args: str, base: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENAI_API_KEY": "", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    env.pop("PROCTOR_LEDGER", None)
    if path is not None:
        env["PATH"] = path
    command = [sys.executable, "-m", "proctor.cli", "run", *args, "--model", "openai/gpt-4o-mini",
               "--model-arg", f"api_base={base}", "--model-arg", "api_key=test"]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_run_code_agent_json(tmp_path: Path) -> None:
    """`proctor run --json` runs the task through the gate and prints the result; exit 0 when done."""
    audit = tmp_path / "audit.jsonl"
    with serve([completion(PROGRAM)]) as fake:
        proc = _proctor("Handle T-100", "--tools", "examples.tools_demo", "--policy", SUPPORT_POLICY,
                        "--audit", str(audit), "--json", base=fake.base)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "done" and result["answer"] == "refunded 19.99 (RF-0001)"
    calls = [c["tool"] for s in result["steps"] for c in s["tool_calls"]]
    assert calls == ["get_ticket", "get_order", "issue_refund"]
    assert result["audit_path"] == str(audit) and audit.exists()
    assert "get_ticket" in fake.requests[0]["body"]["messages"][0]["content"]  # the system prompt lists tools


def test_run_with_a_shadow_policy_records_where_it_disagrees_and_never_acts(tmp_path: Path) -> None:
    """`proctor run --shadow P`: the candidate would deny the refund; the enforced policy's allow stands, and the
    disagreement is a `shadow_decision` record naming both decisions and rules."""
    audit, candidate = tmp_path / "audit.jsonl", tmp_path / "candidate.yaml"
    candidate.write_text(Path(SUPPORT_POLICY).read_text().replace(
        "rules:\n", "rules:\n  - name: no-refunds\n    match: {tool: issue_refund}\n    decision: deny\n", 1))
    with serve([completion(PROGRAM)]) as fake:
        proc = _proctor("Handle T-100", "--tools", "examples.tools_demo", "--policy", SUPPORT_POLICY,
                        "--shadow", str(candidate), "--audit", str(audit), "--json", base=fake.base)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["answer"] == "refunded 19.99 (RF-0001)"
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    [disagreement] = [r for r in records if r["kind"] == "shadow_decision"]
    assert disagreement["tool"] == "issue_refund"
    assert disagreement["enforced"]["decision"] == "allow"
    assert (disagreement["shadow"]["decision"], disagreement["shadow"]["rules"]) == ("deny", ["no-refunds"])


def test_a_bad_shadow_policy_exits_1_with_its_location(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A candidate that does not load stops the run before it starts, located like a bad --policy."""
    bad = tmp_path / "candidate.yaml"
    bad.write_text("version: 1\ndefault: maybe\n")
    code = main(["run", "task", "--tools", "examples.tools_demo", "--policy", SUPPORT_POLICY, "--shadow", str(bad),
                 "--model", "openai/x"])
    assert code == 1
    assert f"{bad}:2:" in capsys.readouterr().err


def test_run_tool_calling_agent_out_of_steps_exits_1() -> None:
    """A run that ends without an answer exits 1 and shows the steps and the summary."""
    with serve([completion(None, [tool_call("c1", "get_ticket", {"ticket_id": "T-101"})])]) as fake:
        proc = _proctor("Look at T-101", "--tools", "examples.tools_demo:get_ticket", "--policy", SUPPORT_POLICY,
                        "--agent", "tool-calling", "--max-steps", "1", base=fake.base)
    assert proc.returncode == 1, proc.stderr
    assert "get_ticket(ticket_id='T-101')" in proc.stdout and "max_steps" in proc.stdout


@pytest.mark.parametrize(("tools", "message"), [
    ("examples.no_such_module", "cannot import 'examples.no_such_module'"),
    ("examples.tools_demo:nothing", "has no attribute 'nothing'"),
    ("json", "defines no @tool functions"),
])
def test_bad_tools_are_usage_errors(tools: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A --tools spec that names nothing usable exits 2 with one line saying why."""
    code = main(["run", "task", "--tools", tools, "--policy", SUPPORT_POLICY, "--model", "openai/x"])
    assert code == 2
    assert message in capsys.readouterr().err


def test_bad_policy_exits_1_with_its_location(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A policy that does not load is reported as FILE:LINE:COL: message; exit 1."""
    bad = tmp_path / "p.yaml"
    bad.write_text("version: 1\ndefault: maybe\n")
    code = main(["run", "task", "--tools", "examples.tools_demo", "--policy", str(bad), "--model", "openai/x"])
    assert code == 1
    assert f"{bad}:2:" in capsys.readouterr().err


def test_webhook_approver_needs_its_secret(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """--approver webhook:URL without PROCTOR_WEBHOOK_SECRET is a usage error."""
    monkeypatch.delenv("PROCTOR_WEBHOOK_SECRET", raising=False)
    code = main(["run", "task", "--tools", "examples.tools_demo", "--policy", SUPPORT_POLICY, "--model", "openai/x",
                 "--approver", "webhook:https://approvals.example/hook"])
    assert code == 2
    assert "PROCTOR_WEBHOOK_SECRET" in capsys.readouterr().err


def test_run_signs_with_audit_key_and_verify_passes_without_warning(tmp_path: Path) -> None:
    """`--audit-key` signs the checkpoints: `audit verify --pubkey` passes with no 'unsigned' warning."""
    audit, key = tmp_path / "audit.jsonl", tmp_path / "audit.key"
    assert main(["audit", "keygen", str(key)]) == 0
    with serve([completion(PROGRAM)]) as fake:
        proc = _proctor("Handle T-100", "--tools", "examples.tools_demo", "--policy", SUPPORT_POLICY,
                        "--audit", str(audit), "--audit-key", str(key), "--json", base=fake.base)
    assert proc.returncode == 0, proc.stderr
    assert f"audit trail: {audit} (signed)" in proc.stderr
    verify = subprocess.run([sys.executable, "-m", "proctor.cli", "audit", "verify", str(audit), "--pubkey",
                             f"{key}.pub", "--json"], capture_output=True, text=True, timeout=60)
    report = json.loads(verify.stdout)
    assert verify.returncode == 0 and report["ok"] and report["signed_checkpoints"] >= 1
    assert not any("unsigned" in w for w in report["warnings"]), report


def test_run_without_audit_writes_to_the_default_path_and_says_so(tmp_path: Path) -> None:
    """No --audit: the trail goes to $XDG_STATE_HOME/proctor/audit.jsonl, named on stderr; --no-audit says it."""
    with serve([completion(PROGRAM), completion(PROGRAM)]) as fake:
        proc = _proctor("Handle T-100", "--tools", "examples.tools_demo", "--policy", SUPPORT_POLICY, "--json",
                        base=fake.base)
        unaudited = _proctor("Handle T-100", "--tools", "examples.tools_demo", "--policy", SUPPORT_POLICY,
                             "--json", "--no-audit", base=fake.base)
    default = Path(os.environ["XDG_STATE_HOME"]) / "proctor" / "audit.jsonl"
    assert proc.returncode == 0, proc.stderr
    assert f"audit trail: {default}" in proc.stderr and default.exists()
    assert json.loads(proc.stdout)["audit_path"] == str(default)
    assert unaudited.returncode == 0 and "no audit trail (--no-audit)" in unaudited.stderr


def test_run_refuses_a_tampered_log_naming_verify(tmp_path: Path) -> None:
    """A complete but corrupted last line is tampering: exit 1, naming `proctor audit verify`, nothing appended."""
    audit = tmp_path / "audit.jsonl"
    from proctor.audit import AuditLog

    with AuditLog(audit) as log:
        log.append("step", {"step": 1})
    (tmp_path / "audit.jsonl.checkpoint").unlink()
    data = audit.read_bytes() + b'{"kind":"step","seq":2}\n'
    audit.write_bytes(data)
    proc = _proctor("Handle T-100", "--tools", "examples.tools_demo", "--policy", SUPPORT_POLICY,
                    "--audit", str(audit), base="http://127.0.0.1:9/v1")
    assert proc.returncode == 1 and "proctor audit verify" in proc.stderr, proc.stderr
    assert audit.read_bytes() == data


def test_run_summary_says_how_programs_were_isolated(tmp_path: Path) -> None:
    """`proctor run`'s summary has a sandbox row: bubblewrap, or process only with the reason (bwrap off PATH)."""
    with serve([completion(PROGRAM)]) as fake:
        proc = _proctor("Handle T-100", "--tools", "examples.tools_demo", "--policy", SUPPORT_POLICY,
                        "--audit", str(tmp_path / "a.jsonl"), base=fake.base)
    assert proc.returncode == 0, proc.stderr
    sandbox = next(line for line in proc.stdout.splitlines() if "│ sandbox" in line)
    assert "│ bubblewrap" in sandbox or "│ process only (" in sandbox
    env_path = str(tmp_path / "no-bwrap")
    with serve([completion(PROGRAM)]) as fake:
        proc = _proctor("Handle T-100", "--tools", "examples.tools_demo", "--policy", SUPPORT_POLICY,
                        "--audit", str(tmp_path / "b.jsonl"), base=fake.base, path=env_path)
    assert proc.returncode == 0, proc.stderr
    assert "process only (bubblewrap not installed: apt-get install bubblewrap)" in proc.stdout


def test_run_refuses_a_global_budget_on_a_local_ledger(tmp_path: Path) -> None:
    """A policy with a cross-run budget and no shared ledger: exit 1, one line naming PROCTOR_LEDGER."""
    policy = tmp_path / "p.yaml"
    policy.write_text("version: 1\ndefault: allow\nbudgets:\n  - {name: pages, per: global, limit: {calls: 3}}\n")
    proc = _proctor("task", "--tools", "examples.tools_demo", "--policy", str(policy), "--no-audit", base="http://x")
    assert proc.returncode == 1
    assert "proctor run: budget 'pages' (per global) counts across runs" in proc.stderr
    assert "PROCTOR_LEDGER=redis://" in proc.stderr and "Traceback" not in proc.stderr
