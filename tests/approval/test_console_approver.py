"""Tests for ConsoleApprover, driven for real through a pseudo-terminal with pexpect."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pexpect
import pytest

# Every test here starts a process (see tests/conftest.py): `make test` runs them, `make check` does not.
pytestmark = pytest.mark.process

SCRIPT = str(Path(__file__).with_name("console_prompt.py"))
PROMPT = "[g]rant > "


def spawn(**config: Any) -> pexpect.spawn:
    """Start console_prompt.py on a fresh pty with `config`."""
    return pexpect.spawn(
        sys.executable, [SCRIPT, json.dumps(config)], encoding="utf-8", timeout=15, dimensions=(50, 140)
    )


def decisions(child: pexpect.spawn, count: int = 1) -> list[dict[str, Any]]:
    """Read the DECISION lines the script prints, then wait for it to exit cleanly."""
    out = []
    for _ in range(count):
        child.expect(r"DECISION:(\{.*?\})\r\n")
        out.append(json.loads(child.match.group(1)))
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    return out


def test_panel_shows_the_request_and_a_approves() -> None:
    """The panel shows tool, class, arguments, rules, reason, budget, policy sha and expiry; 'a' approves."""
    child = spawn(timeout=10)
    child.expect_exact(PROMPT)
    panel = child.before
    for expected in ("approval needed: send_email", "external", '"to": "bob@partner.org"', "external-mail",
                     "mail leaving the company needs a human", '"calls": 4', "sha256 abababababab",
                     "this console waits 10s", "alice", "call_0"):
        assert expected in panel
    child.sendline("a")
    (decision,) = decisions(child)
    assert decision["verdict"] == "approve" and decision["approver"] == f"console:{getpass.getuser()}"


def test_deny_asks_for_a_reason() -> None:
    """'d' asks for a reason and denies with it; the configured approver name is recorded."""
    child = spawn(name="ops-alice")
    child.expect_exact(PROMPT)
    child.sendline("d")
    child.expect_exact("reason for denying")
    child.sendline("partners get mail from sales only")
    (decision,) = decisions(child)
    assert decision["verdict"] == "deny" and decision["reason"] == "partners get mail from sales only"
    assert decision["approver"] == "ops-alice" and decision["timed_out"] is False


def test_unknown_key_asks_again() -> None:
    """An unknown answer explains the keys and asks again."""
    child = spawn()
    child.expect_exact(PROMPT)
    child.sendline("yes please")
    child.expect_exact("unknown answer")
    child.expect_exact(PROMPT)
    child.sendline("A")
    assert decisions(child)[0]["verdict"] == "approve"


def test_edit_reasks_on_invalid_json_then_edits() -> None:
    """'e' asks for a JSON object, re-asking on invalid JSON or a non-object, and answers edit."""
    child = spawn()
    child.expect_exact(PROMPT)
    child.sendline("e")
    child.expect_exact("new arguments")
    child.sendline('{"to": "bob@')
    child.expect_exact("not valid JSON")
    child.expect_exact("new arguments")
    child.sendline("[1, 2]")
    child.expect_exact("must be a JSON object")
    child.expect_exact("new arguments")
    child.sendline('{"to": "bob@example.com", "subject": "hi", "body": "reviewed"}')
    (decision,) = decisions(child)
    assert decision["verdict"] == "edit"
    assert decision["args"] == {"to": "bob@example.com", "subject": "hi", "body": "reviewed"}


def test_edit_can_go_back_to_the_menu() -> None:
    """An empty line at the edit prompt returns to the keys."""
    child = spawn()
    child.expect_exact(PROMPT)
    child.sendline("e")
    child.expect_exact("new arguments")
    child.sendline("")
    child.expect_exact(PROMPT)
    child.sendline("a")
    assert decisions(child)[0]["verdict"] == "approve"


def test_grant_with_an_argument_pattern() -> None:
    """'g' asks for argument globs, rejects unknown argument names, and answers grant."""
    child = spawn()
    child.expect_exact(PROMPT)
    child.sendline("g")
    child.expect_exact("limit to arguments")
    child.sendline("cc=*")
    child.expect_exact("no argument 'cc'")
    child.expect_exact("limit to arguments")
    child.sendline("to=*@partner.org")
    child.expect_exact("<one or more word characters> then '@partner.org'")  # shown before it is given
    child.expect_exact("give this grant? [y/N]")
    child.sendline("y")
    (decision,) = decisions(child)
    assert decision["verdict"] == "grant"
    assert decision["grant"] == {"tool": "send_email", "args": {"to": "*@partner.org"}}


def test_grant_preview_can_be_declined_and_bad_patterns_refused() -> None:
    """A pattern with '?' or a space is refused; declining the preview gives no grant and asks again."""
    child = spawn()
    child.expect_exact(PROMPT)
    child.sendline("g")
    child.expect_exact("limit to arguments")
    child.sendline("to=?@partner.org")
    child.expect_exact("only * and ** are wildcards")
    child.expect_exact("limit to arguments")
    child.sendline("to=*@partner.org")
    child.expect_exact("never e.g.")
    child.expect_exact("give this grant? [y/N]")
    child.sendline("n")
    child.expect_exact("no grant given")
    child.expect_exact(PROMPT)
    child.sendline("a")
    assert decisions(child)[0]["verdict"] == "approve"


def test_grant_for_any_arguments() -> None:
    """An empty pattern grants the tool for any arguments."""
    child = spawn()
    child.expect_exact(PROMPT)
    child.sendline("g")
    child.expect_exact("limit to arguments")
    child.sendline("")
    child.expect_exact("with any arguments")
    child.sendline("y")
    assert decisions(child)[0]["grant"] == {"tool": "send_email", "args": {}}


def test_timeout_denies_as_timed_out() -> None:
    """Nobody answering within the timeout is a deny marked timed out."""
    child = spawn(timeout=0.5)
    child.expect_exact(PROMPT)
    started = time.monotonic()
    (decision,) = decisions(child)
    assert decision["verdict"] == "deny" and decision["timed_out"] is True
    assert decision["approver"] == "timeout" and "within 0.5s" in decision["reason"]
    assert time.monotonic() - started < 5


def test_request_expiry_caps_the_wait() -> None:
    """A request expiring before the console's own timeout times out at the expiry."""
    child = spawn(timeout=30, expires_in=0.8)
    child.expect_exact(PROMPT)
    (decision,) = decisions(child)
    assert decision["timed_out"] is True


def test_timeout_during_a_sub_prompt() -> None:
    """The deadline covers the whole exchange, including the reason prompt."""
    child = spawn(timeout=1.0)
    child.expect_exact(PROMPT)
    child.sendline("d")
    child.expect_exact("reason for denying")
    assert decisions(child)[0]["timed_out"] is True


def test_eof_denies() -> None:
    """Ctrl-D (input ended) denies, saying so."""
    child = spawn()
    child.expect_exact(PROMPT)
    child.sendeof()
    (decision,) = decisions(child)
    assert decision["verdict"] == "deny" and "input ended (EOF)" in decision["reason"]
    assert decision["timed_out"] is False


def test_half_typed_line_then_eof_denies() -> None:
    """Typing 'a' and then Ctrl-D (no Enter) is not an approval."""
    child = spawn()
    child.expect_exact(PROMPT)
    child.send("a")
    child.sendeof()
    child.sendeof()
    assert decisions(child)[0]["verdict"] == "deny"


def test_type_ahead_before_the_panel_is_discarded() -> None:
    """An 'a' + Enter typed before the prompt appeared does not approve."""
    child = spawn(timeout=1.0, await_type_ahead=True)
    child.sendline("a")  # queued before the panel: the script waits for it (a loaded machine cannot reorder them)
    child.expect_exact(PROMPT)
    assert decisions(child)[0]["timed_out"] is True


def test_concurrent_requests_are_asked_one_at_a_time() -> None:
    """Two threads asking at once get two prompts in turn, never interleaved."""
    child = spawn(requests=2, timeout=10)
    child.expect_exact(PROMPT)
    assert child.before.count("approval needed") == 1
    child.sendline("a")
    child.expect_exact("approved by")
    child.expect_exact(PROMPT)
    assert child.before.count("approval needed") == 1
    child.sendline("d")
    child.expect_exact("reason for denying")
    child.sendline("one is enough")
    verdicts = sorted(d["verdict"] for d in decisions(child, 2))
    assert verdicts == ["approve", "deny"]


def test_hostile_arguments_are_shown_escaped() -> None:
    """Markup and bidi/control characters in arguments are printed as visible escapes."""
    child = spawn(args={"to": "[bold red]evil[/] \u202egro.rentrap@bob", "body": "x\u0085y"})
    child.expect_exact(PROMPT)
    panel = child.before
    assert "[bold red]evil[/]" in panel and "\\u202e" in panel and "\u202e" not in panel
    assert "\\x85" in panel
    child.sendline("d")
    child.expect_exact("reason")
    child.sendline("")
    assert decisions(child)[0]["reason"] == "denied at the console"


def test_no_tty_denies_saying_why() -> None:
    """Without a terminal on stdin the request is denied at once, naming the alternatives."""
    done = subprocess.run(
        [sys.executable, SCRIPT, json.dumps({"timeout": 10})],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30, check=True,
    )
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("DECISION:")]
    decision = json.loads(line.removeprefix("DECISION:"))
    assert decision["verdict"] == "deny" and decision["timed_out"] is False
    assert decision["reason"].startswith("no terminal to ask on; run with --approver webhook:")
    assert "approval needed" not in done.stderr


def test_piped_stdin_is_not_a_terminal() -> None:
    """An answer piped on stdin is not trusted as a human at a terminal."""
    done = subprocess.run(
        [sys.executable, SCRIPT, "{}"], input="a\n", capture_output=True, text=True, timeout=30, check=True
    )
    assert '"verdict": "deny"' in done.stdout and "no terminal" in done.stdout
