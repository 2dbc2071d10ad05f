"""`proctor policy check | explain | test | schema`, in process and as a subprocess for exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from proctor.cli import main

POLICY = """\
version: 1
tools:
  send_email: {side_effect: external}
rules:
  - name: reads
    match: {side_effect: read}
    decision: allow
  - name: internal-mail
    match: {tool: send_email}
    when: "args.to.endsWith('@example.com')"
    decision: allow
  - name: external-mail
    match: {tool: send_email}
    when: "!args.to.endsWith('@example.com')"
    decision: require_approval
    reason: mail leaving the company needs a human
  - name: no-exfiltration
    match: {side_effect: [external, destructive]}
    when: "history.exists(c, c.tool == 'read_secret')"
    decision: deny
    reason: nothing leaves after a secret was read
"""

CASES = """\
- name: inside
  tool: send_email
  args: {to: a@example.com}
  expect: allow
  rules: [internal-mail]
- tool: send_email
  args: {to: a@evil.test}
  expect: require_approval
- name: after a secret
  tool: send_email
  args: {to: a@example.com}
  history: [{tool: read_secret}]
  expect: deny
- name: production reader
  tool: lookup
  side_effect: read
  run: {principal: alice, labels: {env: prod}}
  expect: allow
"""


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return path


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proctor.cli", *argv], capture_output=True, text=True, timeout=60)


def test_check_valid(policy_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """check exits 0 on a valid policy and prints its fingerprint."""
    assert main(["policy", "check", str(policy_file)]) == 0
    assert "ok (4 rules, 0 budgets, sha256 " in capsys.readouterr().out


def test_check_invalid_lists_every_issue(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """check exits 1 printing each P:LINE:COL: message."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nrules:\n  - name: r\n    match: {}\n    decision: permit\n")
    assert main(["policy", "check", str(bad)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"{bad}:4:12: rule 'r': empty match: give tool and/or side_effect, or leave out match to match every call",
        f"{bad}:5:15: rule 'r': unknown decision 'permit' (expected one of allow, deny, require_approval)",
    ]


def test_explain_json_prints_exactly_the_decision(policy_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """explain --json prints outcome, rules, reason and policy_sha256 only."""
    code = main(["policy", "explain", str(policy_file), "--tool", "send_email", "--args", '{"to": "x@evil.test"}',
                 "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"outcome", "rules", "reason", "policy_sha256"}
    assert (data["outcome"], data["rules"]) == ("require_approval", ["external-mail"])
    assert data["reason"] == "mail leaving the company needs a human"


def test_explain_human_output_traces_every_rule(policy_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The human form shows the outcome and why each rule did or did not match."""
    code = main(["policy", "explain", str(policy_file), "--tool", "send_email", "--args", '{"to": "a@example.com"}',
                 "--history", '[{"tool": "read_secret", "side_effect": "read"}]', "--run", '{"principal": "bob"}'])
    assert code == 0
    out = capsys.readouterr().out
    assert "outcome:  deny" in out
    assert "rules:    no-exfiltration" in out
    assert "reads [allow] side_effect external is not read" in out
    assert "internal-mail [allow] when holds" in out
    assert "external-mail [require_approval] when does not hold" in out
    assert "no-exfiltration [deny] when holds" in out


def test_explain_side_effect_option(policy_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--side-effect gives an undeclared tool its class."""
    assert main(["policy", "explain", str(policy_file), "--tool", "lookup", "--side-effect", "read", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["outcome"] == "allow"


def test_explain_bad_json_is_a_usage_error(policy_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Malformed --args or --history exits 2."""
    assert main(["policy", "explain", str(policy_file), "--tool", "t", "--args", "{"]) == 2
    assert main(["policy", "explain", str(policy_file), "--tool", "t", "--history", "{}"]) == 2
    assert main(["policy", "explain", str(policy_file), "--tool", "t", "--side-effect", "bogus"]) == 2
    assert "--args:1:2: not valid JSON" in capsys.readouterr().err


def test_test_command_passes_and_fails(policy_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """policy test exits 0 when all cases pass and 1 when one fails, showing a table."""
    cases = tmp_path / "cases.yaml"
    cases.write_text(CASES)
    assert main(["policy", "test", str(policy_file), str(cases)]) == 0
    out = capsys.readouterr().out
    assert "4 passed, 0 failed" in out and "PASS" in out and "production reader" in out
    cases.write_text(CASES.replace("expect: require_approval", "expect: allow"))
    assert main(["policy", "test", str(policy_file), str(cases)]) == 1
    out = capsys.readouterr().out
    assert "3 passed, 1 failed" in out
    assert "FAIL send_email #2: mail leaving the company needs a human" in out


def test_test_command_checks_expected_rules(policy_file: Path, tmp_path: Path) -> None:
    """A case whose rules differ from the deciding rules fails."""
    cases = tmp_path / "cases.yaml"
    cases.write_text("- {tool: send_email, args: {to: a@example.com}, expect: allow, rules: [reads]}\n")
    assert main(["policy", "test", str(policy_file), str(cases)]) == 1


def test_malformed_cases_file_is_located(policy_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad cases file exits 1 naming line and column of each problem."""
    cases = tmp_path / "cases.yaml"
    cases.write_text("- name: one\n  tool: t\n  expect: alow\n- name: two\n  tol: t\n  expect: deny\n")
    assert main(["policy", "test", str(policy_file), str(cases)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{cases}:3:11: case 1 (one): expect: ")
    assert f"{cases}:4:3: case 2 (two): missing key 'tool'" in out
    assert f"{cases}:5:3: case 2 (two): unknown key 'tol'" in out[2]
    cases.write_text("tool: t\n")
    assert main(["policy", "test", str(policy_file), str(cases)]) == 1
    assert "a cases file is a non-empty YAML list of cases" in capsys.readouterr().out


def test_schema_is_a_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    """policy schema prints a JSON Schema describing every section and forbidding unknown keys."""
    assert main(["policy", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert set(schema["properties"]) == {
        "version", "let", "default", "tools", "budgets", "rules", "approval", "read_durability", "reload", "sandbox",
        "ledger"}
    assert schema["additionalProperties"] is False
    assert schema["$defs"]["RuleSpec"]["additionalProperties"] is False
    assert schema["required"] == ["version"]


@pytest.mark.process
def test_exit_codes_through_a_subprocess(policy_file: Path, tmp_path: Path) -> None:
    """The real command exits 0, 1 and 2 as documented."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 2\n")
    ok = run_cli("policy", "check", str(policy_file))
    assert ok.returncode == 0, ok.stderr
    invalid = run_cli("policy", "check", str(bad))
    assert invalid.returncode == 1
    assert invalid.stdout.strip() == f"{bad}:1:10: unsupported version 2 (this proctor reads version 1)"
    assert run_cli("policy", "check").returncode == 2
    assert run_cli("policy", "explain", str(policy_file)).returncode == 2  # --tool is required
    assert run_cli("policy").returncode == 2


TOOLS_MODULE = '''\
from proctor import tool


@tool(side_effect="external")
def send_email(to: str, subject: str = "(none)", tags: list[str] | None = None) -> str:
    """Send a mail.

    Args:
        to: Recipient.
        subject: Subject.
        tags: Labels for the mail.
    """
    return "sent"


@tool(side_effect="read")
def lookup(key: str) -> str:
    """Look up.

    Args:
        key: What.
    """
    return key
'''

BUDGETED = """\
version: 1
tools:
  send_email: {side_effect: external}
budgets:
  - name: outbound
    match: {side_effect: external}
    limit: {calls: 2}
rules:
  - name: mail
    match: {tool: send_email}
    when: "history.all(h, h.tool != 'send_email' || size(h.args.tags) == 0)"
    decision: allow
"""


@pytest.fixture
def tools_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "ops_cli_tools.py").write_text(TOOLS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "ops_cli_tools"


def test_explain_with_tools_completes_arguments_and_history(
    tmp_path: Path, tools_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --tools a history entry without `tags` gets tags=None as in a real run; without, it is taken as written."""
    policy = tmp_path / "p.yaml"
    policy.write_text(BUDGETED)
    history = json.dumps([{"tool": "send_email", "args": {"to": "a@x.example"}}])
    assert main(["policy", "explain", str(policy), "--tool", "send_email", "--args", '{"to": "b@x.example"}',
                 "--history", history, "--tools", tools_module]) == 0
    out = capsys.readouterr().out
    assert "outcome:  deny" in out and "condition failed" in out
    assert '"subject": "(none)"' in out and "schema defaults applied" in out
    assert main(["policy", "explain", str(policy), "--tool", "send_email", "--args", '{"to": "b@x.example"}',
                 "--history", history]) == 0
    out = capsys.readouterr().out
    assert "outcome:  deny" in out  # no such key 'tags': fails closed too, but for another reason
    assert "defaults were not applied" in out


def test_explain_usage_refuses_as_the_gate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--usage loads what budgets used; a call that would pass a limit is denied naming the budget."""
    policy = tmp_path / "p.yaml"
    policy.write_text(BUDGETED)
    assert main(["policy", "explain", str(policy), "--tool", "send_email", "--args", '{"to": "b@x.example"}',
                 "--usage", '{"outbound": {"calls": 2}}']) == 0
    out = capsys.readouterr().out
    assert "outcome:  deny" in out and "budget:   outbound" in out
    assert main(["policy", "explain", str(policy), "--tool", "send_email", "--args", '{"to": "b@x.example"}',
                 "--usage", '{"outbound": {"calls": 1}}', "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["outcome"] == "allow"
    assert main(["policy", "explain", str(policy), "--tool", "send_email", "--usage", '{"outbnd": {"calls": 1}}']) == 2
    assert "no budget named 'outbnd'" in capsys.readouterr().err


def test_cases_with_usage_and_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A case's usage sets what budgets used; `budget:` expects the budget that refused the call."""
    policy = tmp_path / "p.yaml"
    policy.write_text(BUDGETED)
    cases = tmp_path / "c.yaml"
    cases.write_text(
        "- {tool: send_email, args: {to: a}, usage: {outbound: {calls: 2}}, expect: deny, budget: outbound}\n"
        "- {tool: send_email, args: {to: a}, usage: {outbound: {calls: 1}}, expect: allow}\n"
        "- {tool: send_email, args: {to: a}, usage: {outbound: {calls: 1}}, expect: deny, budget: outbound}\n"
    )
    assert main(["policy", "test", str(policy), str(cases)]) == 1
    out = capsys.readouterr().out
    assert "2 passed, 1 failed" in out


def test_cases_file_names_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Unknown rules, budgets, usage keys and case keys are located errors with a did-you-mean, not FAILs."""
    policy = tmp_path / "p.yaml"
    policy.write_text(BUDGETED)
    cases = tmp_path / "c.yaml"
    cases.write_text(
        "- tool: send_email\n"
        "  args: {to: a}\n"
        "  usage: {outbond: {calls: 1}, outbound: {cals: 1}}\n"
        "  expect: allow\n"
        "  rules: [mial]\n"
        "- tool: send_email\n"
        "  expect: alow\n"
        "  rulez: [mail]\n"
    )
    assert main(["policy", "test", str(policy), str(cases)]) == 1
    out = capsys.readouterr().out
    assert f"{cases}:7:11: case 2: expect: unknown value 'alow' (did you mean 'allow'?)" in out
    assert f"{cases}:8:3: case 2: unknown key 'rulez' (did you mean 'rules'?)" in out
    assert main(["policy", "test", str(policy), str(cases.with_name("c2.yaml"))]) == 1
    missing = f"{cases.with_name('c2.yaml')}:1:1: cannot read cases file: No such file or directory"
    assert missing in capsys.readouterr().out
    cases.write_text(cases.read_text().split("- tool: send_email\n  expect")[0])
    assert main(["policy", "test", str(policy), str(cases)]) == 1
    out = capsys.readouterr().out
    assert f"{cases}:3:11: case 1: usage: no budget named 'outbond' (did you mean 'outbound'?)" in out
    assert f"{cases}:3:43: case 1: usage: unknown key 'cals' (did you mean 'calls'?)" in out
    assert f"{cases}:5:11: case 1: rules: no rule named 'mial' (did you mean 'mail'?)" in out


def test_missing_files_read_the_same(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """check, explain and test word a missing policy file the same way."""
    missing = tmp_path / "nope.yaml"
    expected = f"{missing}:1:1: cannot read policy: No such file or directory"
    assert main(["policy", "check", str(missing)]) == 1
    assert main(["policy", "explain", str(missing), "--tool", "t"]) == 1
    assert main(["policy", "test", str(missing), str(missing)]) == 1
    assert capsys.readouterr().out.splitlines() == [expected] * 3


def test_check_lints_with_tools(tmp_path: Path, tools_module: str, capsys: pytest.CaptureFixture[str]) -> None:
    """check warns on near-miss tool names and raw string comparisons; --tools makes names and args.x errors."""
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\n"
        "tools:\n"
        "  send_email: {side_effect: external}\n"
        "rules:\n"
        "  - name: mail\n"
        "    match: {tool: send_emial}\n"
        "    when: \"args.too.endsWith('@x.com') && usage['nope'].calls > 1\"\n"
        "    decision: allow\n"
    )
    assert main(["policy", "check", str(policy)]) == 1
    out = capsys.readouterr().out
    assert f"{policy}:6:19: warning: rule 'mail': match.tool 'send_emial' is not declared under tools: " \
           "(did you mean 'send_email'?)" in out
    assert f"{policy}:7:12: warning: rule 'mail': when: args.too is compared as written" in out
    assert f"{policy}:7:43: rule 'mail': when: usage['nope'] names no budget (budgets: none)" in out
    policy.write_text(policy.read_text().replace("send_emial", "[send_emial, send_email]").replace(
        " && usage['nope'].calls > 1", ""))
    assert main(["policy", "check", str(policy), "--tools", tools_module]) == 1
    out = capsys.readouterr().out
    assert "rule 'mail': match.tool 'send_emial' is not one of the tools (did you mean 'send_email'?)" in out
    assert "rule 'mail': when: args.too: no tool this rule matches has a parameter 'too' (did you mean 'to'?)" in out
