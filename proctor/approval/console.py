"""Ask the human at the terminal.

Input is read straight from the terminal's file descriptor with ``select()``, so a
timeout leaves no thread blocked on ``input()`` and a late keystroke cannot answer
a request that has already timed out. Type-ahead is discarded when a prompt opens:
an Enter pressed before the panel appeared never approves anything. One prompt is
open at a time; concurrent requests queue on a lock (and their wait counts toward
their timeout).

Anything but a clear answer is a deny that says why: no terminal, input ended
(Ctrl-D), nobody answered in time.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
import select
import sys
import threading
import time
from typing import Any, TextIO

from rich.console import Console
from rich.text import Text

from proctor.approval.base import ApprovalDecision, ApprovalRequest, Grant
from proctor.approval.grants import GrantPattern, describe_grant
from proctor.approval.panel import KEYS_HELP, format_duration, render_request, safe_text
from proctor.errors import ConfigurationError
from proctor.jsoninput import loads_bounded
from proctor.policy.approvers import os_account, os_answerer, refusal

__all__ = ["ConsoleApprover", "parse_grant_patterns"]

# One terminal per process: every ConsoleApprover shares this lock, so two approvers
# (or two threads) never draw panels into each other or race for the same keystrokes.
_TERMINAL_LOCK = threading.Lock()

NO_TTY_REASON = "no terminal to ask on; run with --approver webhook:… or a CallbackApprover"


class _Timeout(Exception):
    """Nobody answered before the deadline."""


class _Eof(Exception):
    """The terminal's input ended (Ctrl-D)."""


class _TtyLines:
    """Lines from a terminal fd in canonical mode, each read bounded by a deadline."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""

    def discard_pending(self) -> None:
        self.buffer = b""
        try:
            import termios

            termios.tcflush(self.fd, termios.TCIFLUSH)
        except (ImportError, OSError):
            pass  # not a real tty or not POSIX: nothing was typed ahead that we could drop

    def readline(self, deadline: float | None) -> str:
        while b"\n" not in self.buffer:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise _Timeout
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if not ready:
                continue  # re-check the deadline at the top of the loop
            chunk = os.read(self.fd, 4096)
            if not chunk:
                # EOF. A half-typed line followed by Ctrl-D is not an answer either.
                self.buffer = b""
                raise _Eof
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode("utf-8", "replace").rstrip("\r")


def parse_grant_patterns(text: str, arg_names: set[str] | None = None) -> dict[str, str]:
    """Parse ``to=*@example.com subject=Weekly*`` into ``{"to": "*@example.com", ...}``.

    Pairs are separated by whitespace (a glob cannot contain one); raises ValueError
    with a message fit for the prompt.
    """
    patterns: dict[str, str] = {}
    for token in text.split():
        name, sep, glob = token.partition("=")
        if not sep or not name or not glob:
            raise ValueError(f"{token!r} is not name=glob (e.g. to=*@example.com)")
        if arg_names is not None and name not in arg_names:
            have = ", ".join(sorted(arg_names)) or "none"
            raise ValueError(f"this call has no argument {name!r} (it has: {have})")
        GrantPattern.parse(glob)  # ValueError names what the pattern may not hold
        patterns[name] = glob
    return patterns


def _os_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry / no env in a container: fall back to the uid
        return f"uid{os.getuid()}" if hasattr(os, "getuid") else "unknown"


class ConsoleApprover:
    """Show the request in a panel and read the answer from the terminal.

    `timeout` (seconds) caps the wait; the request's own expiry caps it too. `console`
    is where the panel goes (default: stderr); `stream_in` the terminal to read
    (default: ``sys.stdin`` at request time). `approver_name` is recorded as who
    decided (default ``console:<OS user>``).

    The terminal's OS account (the process's effective uid) is who answers: a policy's
    `approvers:` are checked against it (its groups from `approval.os_users`) before anything is
    shown, and where the policy names approvers `approver_name` is accepted only where that mapping
    lets the account act as it (the same rule as `proctor approvals --as`). With `not: principal`,
    the run's principal is never asked.
    """

    def __init__(
        self,
        *,
        timeout: float | None = None,
        console: Console | None = None,
        stream_in: TextIO | None = None,
        approver_name: str | None = None,
    ) -> None:
        if timeout is not None and timeout <= 0:
            raise ConfigurationError("ConsoleApprover timeout must be positive seconds (or None)")
        self.timeout = timeout
        self.console = console if console is not None else Console(stderr=True)
        self.stream_in = stream_in
        self.approver_name = approver_name
        self._lock = _TERMINAL_LOCK

    def __repr__(self) -> str:
        return f"ConsoleApprover(timeout={self.timeout!r}, approver_name={self.approver_name!r})"

    @property
    def name(self) -> str:
        return self.approver_name or f"console:{_os_user()}"

    def _answerer(self, request: ApprovalRequest) -> tuple[str, str | None]:
        """Who answers at this terminal (its OS account, or `approver_name` where the policy's
        `approval.os_users` lets that account act as it), and why they may not answer, if so."""
        if not request.approvers:  # the policy names nobody: `approver_name` is just what is recorded
            return self.name, None
        found = os_answerer(os_account(), self.approver_name, request.os_users)
        if isinstance(found, str):
            return self.name, found
        return self.name, refusal(found, request.approvers, request.run.principal)

    def _decided(self, decision: ApprovalDecision) -> ApprovalDecision:
        """`decision` with how its approver was proven: the OS account at the terminal."""
        if decision.approver == "timeout":
            return decision
        return dataclasses.replace(decision, method="console", os_user=os_account(),
                                   answered_at_ns=decision.answered_at_ns or time.time_ns())

    def request(self, request: ApprovalRequest) -> ApprovalDecision:
        return self._decided(self._request(request))

    def _request(self, request: ApprovalRequest) -> ApprovalDecision:
        name, refused = self._answerer(request)
        if refused is not None:  # never shown: this terminal's user may not answer this call
            self._say(f"{request.tool}: not asked at this terminal: {refused}", "bold red")
            return ApprovalDecision.deny(request, name, f"refused at the console: {refused}")
        expires_in = (request.expires_at_ns - time.time_ns()) / 1e9
        limit = expires_in if self.timeout is None else min(self.timeout, expires_in)
        if limit <= 0:
            reason = "the approval request expired before it was shown"
            return ApprovalDecision.deny(request, "timeout", reason, timed_out=True)
        deadline = time.monotonic() + limit
        fd = self._tty_fd()
        if fd is None:
            return ApprovalDecision.deny(request, name, NO_TTY_REASON)
        if not self._lock.acquire(timeout=limit):
            return self._timed_out(request, limit)
        try:
            lines = _TtyLines(fd)
            lines.discard_pending()
            wait_limit = self.timeout if self.timeout is not None and self.timeout < expires_in else None
            self.console.print(render_request(request, wait_limit=wait_limit))
            return self._ask(request, lines, deadline, name)
        except _Timeout:
            self._say("\nno answer in time: denied", "bold red")
            return self._timed_out(request, limit)
        except _Eof:
            self._say("\ninput ended: denied", "bold red")
            return ApprovalDecision.deny(request, name, "input ended (EOF) before an answer at the console")
        finally:
            self._lock.release()

    # -- internals -----------------------------------------------------------------

    def _tty_fd(self) -> int | None:
        stream = self.stream_in if self.stream_in is not None else sys.stdin
        if stream is None:
            return None
        try:
            if not stream.isatty():
                return None
            return stream.fileno()
        except (AttributeError, OSError, ValueError):  # closed, or a stream with no fd
            return None

    def _timed_out(self, request: ApprovalRequest, limit: float) -> ApprovalDecision:
        return ApprovalDecision.deny(
            request, "timeout", f"no answer at the console within {format_duration(limit)}", timed_out=True
        )

    def _say(self, message: str, style: str = "") -> None:
        self.console.print(Text(safe_text(message), style=style))

    def _prompt(self, lines: _TtyLines, deadline: float, prompt: str) -> str:
        self.console.print(Text(prompt), end="", soft_wrap=True)
        self.console.file.flush()
        return lines.readline(deadline)

    def _ask(self, request: ApprovalRequest, lines: _TtyLines, deadline: float, name: str) -> ApprovalDecision:
        while True:
            key = self._prompt(lines, deadline, f"{KEYS_HELP} > ").strip().lower()
            if key in ("a", "approve"):
                self._say(f"approved by {name}", "bold green")
                return ApprovalDecision.approve(request, name)
            if key in ("d", "deny"):
                reason = self._prompt(lines, deadline, "reason for denying (Enter for none): ").strip()
                self._say(f"denied by {name}", "bold red")
                return ApprovalDecision.deny(request, name, reason or "denied at the console")
            if key in ("e", "edit"):
                new_args = self._ask_args(request, lines, deadline)
                if new_args is None:
                    continue
                self._say(f"edited by {name}; the new arguments go through the policy again", "bold yellow")
                return ApprovalDecision("edit", request.binding, name, "arguments edited at the console", args=new_args)
            if key in ("g", "grant"):
                patterns = self._ask_patterns(request, lines, deadline)
                if patterns is None:
                    continue
                # Before it is given: what the grant will admit, and that smuggled values are not.
                for line in describe_grant(Grant(request.tool, patterns), request.args):
                    self._say(line, "cyan")
                sure = self._prompt(lines, deadline, "give this grant? [y/N] ").strip().lower()
                if sure not in ("y", "yes"):
                    self._say("no grant given", "yellow")
                    continue
                scope = " ".join(f"{k}={v}" for k, v in patterns.items()) or "any arguments"
                self._say(f"granted {request.tool} ({scope}) for the rest of the run by {name}", "bold green")
                grant = Grant(request.tool, patterns)
                reason = f"granted at the console for the rest of the run ({scope})"
                return ApprovalDecision("grant", request.binding, name, reason, grant=grant)
            self._say(f"unknown answer {safe_text(key)!r}: type a, d, e or g and press Enter", "yellow")

    def _ask_args(self, request: ApprovalRequest, lines: _TtyLines, deadline: float) -> dict[str, Any] | None:
        current = json.dumps(dict(request.args), sort_keys=True, ensure_ascii=False, default=repr)
        self._say(f"current (redacted values stay redacted): {safe_text(current)}", "dim")
        while True:
            text = self._prompt(lines, deadline, "new arguments as one JSON object (Enter to go back): ").strip()
            if not text:
                return None
            try:
                value = loads_bounded(text, "arguments")
            except ConfigurationError as exc:
                self._say(safe_text(str(exc)), "yellow")
                continue
            if not isinstance(value, dict):
                self._say(f"arguments must be a JSON object, not {type(value).__name__}", "yellow")
                continue
            return value

    def _ask_patterns(self, request: ApprovalRequest, lines: _TtyLines, deadline: float) -> dict[str, str] | None:
        while True:
            text = self._prompt(
                lines, deadline, "limit to arguments, e.g. to=*@example.com (Enter: any arguments, '-' to go back): "
            ).strip()
            if text == "-":
                return None
            try:
                return parse_grant_patterns(text, set(request.args))
            except ValueError as exc:
                self._say(str(exc), "yellow")
