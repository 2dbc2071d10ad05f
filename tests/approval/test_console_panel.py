"""Tests for the console approver's panel and in-process behaviour (an os.openpty terminal)."""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Iterator
from typing import TextIO

import pytest
from approval_helpers import make_request
from rich.console import Console

from proctor.approval import ConsoleApprover
from proctor.approval.console import NO_TTY_REASON, parse_grant_patterns
from proctor.approval.panel import format_duration, render_request, safe_text


def recorded(approver_console: Console) -> str:
    file = approver_console.file
    assert isinstance(file, io.StringIO)
    return file.getvalue()


def plain_console() -> Console:
    return Console(file=io.StringIO(), width=120, color_system=None)


@pytest.fixture
def terminal() -> Iterator[tuple[TextIO, int]]:
    """A real pseudo-terminal: (the stream the approver reads, the fd the 'human' types into)."""
    main_fd, tty_fd = os.openpty()
    stream = os.fdopen(tty_fd, "r")
    yield stream, main_fd
    stream.close()
    os.close(main_fd)


def test_safe_text_escapes_control_and_format_characters() -> None:
    """ANSI escapes, C1 controls and bidi overrides become visible escapes; ordinary text stays."""
    assert safe_text("a\x1b[2Jb\x85c\u202ed é") == "a\\x1b[2Jb\\x85c\\u202ed é"
    assert safe_text("one\ntwo", keep_newlines=True) == "one\ntwo"
    assert safe_text("one\ntwo") == "one\\x0atwo"


def test_format_duration() -> None:
    """Durations read as a countdown."""
    assert [format_duration(s) for s in (0.25, 9.5, 42, 125, 3725)] == ["0.2s", "9.5s", "42s", "2m05s", "1h02m"]


def test_parse_grant_patterns() -> None:
    """name=glob pairs parse; malformed pairs and unknown names are refused with a useful message."""
    assert parse_grant_patterns("to=*@example.com  subject=Weekly*") == {"to": "*@example.com", "subject": "Weekly*"}
    assert parse_grant_patterns("   ") == {}
    with pytest.raises(ValueError, match="not name=glob"):
        parse_grant_patterns("to")
    with pytest.raises(ValueError, match=r"has no argument 'cc' \(it has: body, to\)"):
        parse_grant_patterns("cc=*", {"to", "body"})


def test_panel_lists_every_field_without_markup() -> None:
    """The panel carries every field of the request, and markup in arguments is printed literally."""
    console = plain_console()
    req = make_request(args={"to": "[red]x[/red]"}, budget={})
    console.print(render_request(req, wait_limit=5.0))
    text = recorded(console)
    for expected in ("approval needed: send_email", "side effect", "external", '"to": "[red]x[/red]"',
                     "external-mail", "(no budget applies)", "sha256 abababababab", "this console waits 5.0s",
                     "alice · run_abc step 2 · env=prod", "call_123", "[a]pprove  [d]eny  [e]dit  [g]rant"):
        assert expected in text


def test_not_a_tty_denies_without_prompting() -> None:
    """A stream that is not a terminal is a deny naming the alternatives, and nothing is printed."""
    console = plain_console()
    decision = ConsoleApprover(console=console, stream_in=io.StringIO("a\n"), approver_name="x").request(make_request())
    assert (decision.verdict, decision.reason, decision.approver) == ("deny", NO_TTY_REASON, "x")
    assert recorded(console) == ""


def test_expired_request_is_denied_at_once(terminal: tuple[TextIO, int]) -> None:
    """A request already past its expiry is a timed-out deny without a prompt."""
    console = plain_console()
    decision = ConsoleApprover(console=console, stream_in=terminal[0]).request(make_request(expires_in=-1))
    assert decision.timed_out and recorded(console) == ""


def test_in_process_pty_approve(terminal: tuple[TextIO, int]) -> None:
    """With a pty as stdin, a typed 'a' approves."""
    stream, human = terminal
    console = plain_console()
    approver = ConsoleApprover(timeout=5, console=console, stream_in=stream, approver_name="tester")
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(approver.request(make_request())))
    thread.start()
    deadline = time.monotonic() + 10
    while "rant > " not in recorded(console) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.write(human, b"a\n")
    thread.join(5)
    (decision,) = result
    assert getattr(decision, "verdict", None) == "approve"


def test_waiting_for_the_lock_counts_toward_the_timeout(terminal: tuple[TextIO, int]) -> None:
    """A request queued behind another prompt times out when its time runs out, without printing."""
    console = plain_console()
    approver = ConsoleApprover(timeout=0.2, console=console, stream_in=terminal[0])
    approver._lock.acquire()  # another prompt is open
    try:
        decision = approver.request(make_request())
    finally:
        approver._lock.release()
    assert decision.timed_out and "within 0.2s" in decision.reason and recorded(console) == ""


def test_timeout_must_be_positive() -> None:
    """A zero or negative timeout is a configuration error."""
    with pytest.raises(ValueError, match="positive"):
        ConsoleApprover(timeout=0)
