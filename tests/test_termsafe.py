"""Untrusted text on the terminal: one escaping function, and look-alikes marked on the approval panel."""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path

import pytest
from rich.console import Console

from proctor.agent import CodeAgent, ScriptedModel
from proctor.agent.render import StepPrinter, summary_table
from proctor.approval.panel import render_request
from proctor.audit import AuditLog
from proctor.cli import main
from proctor.policy import Policy
from proctor.termsafe import look_alikes, marked_text, terminal_safe
from proctor.tools import tool

sys.path.insert(0, str(Path(__file__).parent / "approval"))
from approval_helpers import make_request

ERASE = "\x1b[6A\x1b[J…all calls allowed"
HOSTILE = [
    "\x1b[2J", "\x1b]0;pwned\x07", "\x9b6A", "\x7f", "\u202e", "\u2066", "\u200b", "\ufeff", "\u00ad",
    "\u3164", "\u034f", "\ufe0f", "\U000e0041", "\u2028", "\u2029", "\u115f", "\uffa0", "\u2800", "\ue000",
]


@pytest.mark.parametrize("bad", HOSTILE)
def test_every_hostile_character_becomes_a_visible_escape(bad: str) -> None:
    """Controls, bidi, zero-width, fillers, joiners, tags, separators and private use never reach the terminal raw."""
    shown = terminal_safe(f"a{bad}b")
    assert shown.startswith("a") and shown.endswith("b")
    assert all(ch not in shown for ch in bad if not (ch.isascii() and ch.isprintable()))
    assert "\\" in shown


def test_ordinary_text_is_unchanged() -> None:
    """Accents, CJK, Cyrillic words, emoji and newlines (when kept) pass as they are."""
    text = "café José 中文 привет 🙂 a\\b"
    assert terminal_safe(text) == text
    assert terminal_safe("one\ntwo\tx", keep_newlines=True, keep_tabs=True) == "one\ntwo\tx"
    assert terminal_safe("one\ntwo") == "one\\x0atwo"
    assert terminal_safe(42) == "42"


def test_look_alikes_in_an_address() -> None:
    """The issue's addresses: Cyrillic U+0435, U+3164 and U+034F are each found and named; plain ones are clean."""
    (cyr,) = look_alikes("bob@\u0435xample.com")
    assert (cyr.index, cyr.kind, cyr.name) == (4, "confusable", "CYRILLIC SMALL LETTER IE")
    (filler,) = look_alikes("bob\u3164@example.com")
    assert filler.kind == "invisible" and filler.name == "HANGUL FILLER"
    (cgj,) = look_alikes("bo\u034fb@example.com")
    assert cgj.kind == "invisible" and cgj.name == "COMBINING GRAPHEME JOINER"
    assert look_alikes("bob@example.com") == []
    assert look_alikes("привет мир") == [] and look_alikes("café José") == []
    kinds = {m.name for m in look_alikes("\uff41dmin pay\u00a0pal \U0001d41ab x\u0301y")}
    assert kinds == {"FULLWIDTH LATIN SMALL LETTER A", "NO-BREAK SPACE", "MATHEMATICAL BOLD SMALL A",
                     "COMBINING ACUTE ACCENT"}


def _panel_text(args: dict[str, object], tool_name: str = "send_email") -> str:
    console = Console(file=io.StringIO(), width=160, color_system=None)
    console.print(render_request(make_request(tool=tool_name, args=args)))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def test_panel_marks_confusable_and_invisible_characters() -> None:
    """The approval panel shows the Cyrillic U+0435 with its code point, fillers as escapes, and a warning row."""
    out = _panel_text({"to": "bob@\u0435xample.com", "cc": "bob\u3164@example.com", "bcc": "bo\u034fb@example.com"})
    assert "bob@\u0435⟨U+0435⟩xample.com" in out
    assert "bob\\u3164@example.com" in out and "bo\\u034fb@example.com" in out
    assert "\u3164" not in out and "\u034f" not in out
    for name in ("U+0435 CYRILLIC SMALL LETTER IE", "U+3164 HANGUL FILLER", "U+034F COMBINING GRAPHEME JOINER"):
        assert name in out
    assert "look-alikes" in out


def test_panel_without_look_alikes_has_no_warning() -> None:
    """An ordinary request shows no warning row."""
    assert "look-alikes" not in _panel_text({"to": "bob@example.com", "body": "merci, José"})


def test_panel_tool_name_and_markup_are_data() -> None:
    """A tool name or argument holding rich markup or escapes is shown literally."""
    out = _panel_text({"x": "[bold red]approve me[/] \x1b[2J"}, tool_name="send\x1b[31m")
    assert "[bold red]approve me[/]" in out and "\\u001b[2J" in out and "send\\x1b[31m" in out
    assert "U+001B CONTROL CHARACTER" in out
    assert "\x1b" not in out


def test_marked_text_is_never_markup() -> None:
    """marked_text keeps brackets as text and styles only the marked characters."""
    text = marked_text("[b]x[/b] \u0435x")
    assert text.plain == "[b]x[/b] \u0435⟨U+0435⟩x"


@tool(side_effect="read")
def fetch(url: str) -> str:
    """Fetch a page.

    Args:
        url: The address.
    """
    return ERASE


def test_step_output_cannot_erase_the_calls_table() -> None:
    """A tool result and program output carrying ESC sequences are printed escaped by `proctor run`'s printer."""
    policy = Policy.from_dict({"version": 1, "rules": [{"name": "reads", "match": {"side_effect": "read"},
                                                         "decision": "allow"}]})
    program = ('Thought: x\x1b[2J.\n```python\nr = fetch("http://x")\nprint(r)\nprint("\\x9b2J\\u202eevil")\n'
               'final_answer(r)\n```')
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)  # a terminal: colours on
    printer = StepPrinter(console)
    with CodeAgent([fetch], ScriptedModel([program]), policy, program_callbacks=[printer.program],
                   step_callbacks=[printer.done]) as agent:
        result = agent.run("go")
    console.print(summary_table(result))
    text = out.getvalue()
    assert result.answer == ERASE
    assert "\x1b[6A" not in text and "\x1b[J" not in text and "\x1b[2J" not in text
    assert "\x9b" not in text and "\u202e" not in text
    assert "\\x1b[6A\\x1b[J…all calls allowed" in text and "\\x9b2J\\u202eevil" in text


def test_audit_show_and_tail_escape_record_text(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Record fields with ESC, C1 and bidi characters are escaped by show, tail and tail --json."""
    monkeypatch.setenv("COLUMNS", "250")
    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as log:
        log.append("call_intent", {"call_id": "c\x1b[2J1", "run_id": "r\u202e1", "tool": "t\x9b31m",
                                   "decision": "allow"})
    for command in (["audit", "show", str(path)], ["audit", "tail", str(path)], ["audit", "tail", str(path), "--json"]):
        assert main(command) == 0
        out = capsys.readouterr().out
        assert "\x1b[2J" not in out and "\u202e" not in out and "\x9b" not in out, command
        assert "r\\u202e1" in out and "t\\x9b31m" in out, command


def test_audit_verify_escapes_the_failure_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tampered record whose kind is an escape sequence is reported with the sequence escaped."""
    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as log:
        log.append("step", {})
    lines = path.read_bytes().splitlines(keepends=True)
    lines[0] = lines[0].replace(b'"kind":"step"', '"kind":"\u009b2J\u202e"'.encode())
    path.write_bytes(b"".join(lines))
    assert main(["audit", "verify", str(path), "--no-side-file"]) == 1
    out = capsys.readouterr().out
    assert "TAMPERED" in out and "\x9b" not in out and "\u202e" not in out


def test_policy_explain_and_test_escape_untrusted_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Arguments and case names holding escapes are shown escaped by explain and test."""
    policy = tmp_path / "p.yaml"
    policy.write_text("version: 1\nrules:\n  - {name: r, match: {tool: t}, decision: deny, reason: \"no\"}\n")
    assert main(["policy", "explain", str(policy), "--tool", "t\u202e", "--args", '{"a": "\\u001b[2J"}']) == 0
    out = capsys.readouterr().out
    assert "\u202e" not in out and "\x1b" not in out
    cases = tmp_path / "cases.yaml"
    cases.write_text('- name: "x\\e[2Jy"\n  tool: t\n  expect: allow\n')
    assert main(["policy", "test", str(policy), str(cases)]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and "x\\x1b[2Jy" in out


def test_console_logs_escape_fields() -> None:
    """structlog's console renderer gets escaped strings; the event still reads."""
    from proctor.telemetry.logging import configure_logging, get_logger

    stream = io.StringIO()
    configure_logging(json=False, stream=stream, stdlib=False)
    try:
        get_logger("x").warning("tool said \x1b[2J", result="\u202eevil\x9b")
    finally:
        configure_logging(json=True, stream=sys.stderr, stdlib=False)
        logging.getLogger().handlers.clear()
    text = stream.getvalue()
    assert "tool said \\x1b[2J" in text and "\\u202eevil\\x9b" in text
    assert "\u202e" not in text and "\x9b" not in text


def test_every_rendering_marks_the_same_characters() -> None:
    """The console panel, the inbox's HTML and the plain text of `approvals show` and the API are all made
    from `marked_segments`: each marks exactly the characters `look_alikes` finds, and none is left raw."""
    from proctor.termsafe import marked_html, marked_plain, marked_segments

    text = "pay web-7f9\u0441 \u202eatad\u200b <b>&amp;</b> caf\u00e9 \uff41"
    marks = look_alikes(text)
    segments = marked_segments(text)
    assert [s.mark for s in segments if s.mark is not None] == marks
    plain = marked_plain(text)
    html = marked_html(text)
    rich = marked_text(text)
    for mark in marks:
        if mark.kind == "invisible":
            assert mark.char not in plain and mark.char not in html and mark.char not in rich.plain
            assert f"\\u{ord(mark.char):04x}" in plain and f'title="{mark.label}"' in html
        else:
            assert f"{mark.char}\u27e8U+{ord(mark.char):04X}\u27e9" in plain
            assert f'<mark class="confusable" title="{mark.label}">{mark.char}' in html
    assert "<b>" not in html and "&lt;b&gt;&amp;amp;&lt;/b&gt;" in html  # text, never markup
    assert "caf\u00e9" in plain and "caf\u00e9" in html  # an accented Latin letter is its own letter
    assert html.count("<mark") == len(marks) and plain.count("\u27e8U+") == sum(m.kind == "confusable" for m in marks)
