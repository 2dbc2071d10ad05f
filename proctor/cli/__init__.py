"""The `proctor` command: a thin dispatcher over one module per command group.

Every command-line module lives in this package (`proctor.cli.policy`, `proctor.cli.audit`,
`proctor.cli.run`, …), each registering its commands, so this file stays small. The package is
the top layer: it may import any part of proctor, and no part imports it (tests/test_layout.py).
A command module parses, calls the part's public functions, and prints; what other code needs
lives in the part itself.
Exit codes: 0 success, 1 the thing checked is bad or the run failed, 2 usage.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["COMMANDS", "PIPE_CLOSED", "build_parser", "main"]

# Each command, and the module that defines `register(subparsers) -> None` for it: the module adds
# its commands and sets `func` on their parsers. Imported at start-up, so they must import lightly.
COMMANDS = {
    "demo": "proctor.cli.demo",
    "policy": "proctor.cli.policy",
    "audit": "proctor.cli.audit",
    "run": "proctor.cli.run",
    "approvals": "proctor.cli.store",
    "runs": "proctor.cli.store",
    "serve": "proctor.cli.serve",
    "halt": "proctor.cli.halt",
    "mcp": "proctor.cli.mcp",
}
_COMMAND_MODULES = tuple(dict.fromkeys(COMMANDS.values()))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `proctor` parser; given the `command` about to run, only that command's module is imported
    (`proctor policy check` need not import the agent's, the store's and the server's commands)."""
    parser = argparse.ArgumentParser(
        prog="proctor", description="Governed tool execution for LLM agents that act by writing Python."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in (COMMANDS[command],) if command is not None and command in COMMANDS else _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from proctor.importpath import cwd_not_importable

    # `python -m proctor.cli` puts the current directory first on sys.path: no file there
    # may shadow what proctor imports (only `--tools` resolves its module there).
    with cwd_not_importable():
        was_devnull = _stdout_is_devnull()
        try:
            status = _main(argv)
            if not sys.stdout.closed:  # `mcp serve` over stdio: the SDK (1.x) closes stdout when it ends
                sys.stdout.flush()  # here, not at exit: a reader that left must not turn into a traceback
            return status
        except BrokenPipeError:
            return _pipe_closed()
        except SystemExit as exc:
            # rich's Console meets a closed pipe by pointing stdout at /dev/null and exiting 1
            # (`Console.on_broken_pipe`): that is a closed pipe too, and ends the same way.
            if exc.code == 1 and not was_devnull and _stdout_is_devnull():
                return PIPE_CLOSED
            raise


#: What a shell reports for a command ended by SIGPIPE (128 + 13): `proctor runs show R | head` ends as
#: `yes | head` does. The signal itself stays ignored (Python's default), so a closed socket in
#: `proctor serve` or a webhook approver is an error to handle, never a silent death.
PIPE_CLOSED = 141


def _stdout_is_devnull() -> bool:
    import os

    try:
        out, null = os.fstat(sys.stdout.fileno()), os.stat(os.devnull)
    except (OSError, ValueError):
        return False
    return (out.st_rdev, out.st_ino) == (null.st_rdev, null.st_ino)


def _pipe_closed() -> int:
    """stdout's reader went away (`| head`): stop quietly. What is still buffered is dropped (stdout
    becomes /dev/null), so the interpreter's last flush has nothing to fail on."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return PIPE_CLOSED


def _main(argv: Sequence[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(func(args))
    except KeyboardInterrupt:
        print("interrupted (SIGINT); what happened so far is in the audit log", file=sys.stderr)
        return 130
    except BaseException as exc:
        # A Terminated exists only where a command imported proctor.interrupts (which imports signal):
        # looked up there, so commands that never install its handlers do not import it.
        interrupts = sys.modules.get("proctor.interrupts")
        if interrupts is None or not isinstance(exc, interrupts.Terminated):
            raise
        print("terminated; what happened so far is in the audit log", file=sys.stderr)
        return 128 + int(exc.signum)

