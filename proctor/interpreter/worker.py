"""The worker: runs model programs in a persistent namespace holding tool *stubs* only.

Started by the host (see `sandbox.py`) as ``python -I -S -B -c BOOTSTRAP FD`` with this
module's code (and that of `channel`, `guard`, `worker_io` and `proctor.errors`) marshalled
on stdin; fd 1 is the log pipe, FD_IN and FD_OUT the channel (a pipe each way). The worker imports only the standard
library and those modules — never the tools, never pydantic. A stub
binds its arguments like the real function would, sends ``call`` and blocks until the
host's ``reply``; the host alone decides and runs the tool.
"""

from __future__ import annotations

import _ast
import _thread
import os
import sys

from proctor import errors as proctor_errors
from proctor.errors import FinalAnswer
from proctor.interpreter import channel as _channel
from proctor.interpreter import guard, program
from proctor.interpreter.channel import (
    SCALAR_TYPES,
    EncodeError,
    ProtocolError,
    call_frame,
    decode_value,
    encode_value,
)
from proctor.interpreter.worker_io import Channel, Output

# typing is not imported at run time: every import here is worker start-up time.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["FinalAnswer", "main"]

PROGRAM = "<program>"
#: The errors a reply may name, raised at the call site; the signals in `proctor.errors` are not among them.
_ERRORS = {name: cls for name, cls in vars(proctor_errors).items()
           if isinstance(cls, type) and issubclass(cls, proctor_errors.ProctorError)}
_STALE = ("{}: refused, this thread was started by an earlier program; only the running program's "
          "threads may call tools")


class Worker:
    def __init__(self, channel: Channel, init: dict[str, Any]) -> None:
        self.channel = channel
        self.run_id = 0
        self.active = False
        # Threads alive when a program starts belong to earlier programs: ident -> their run.
        self.stale: dict[int, int] = {}
        self.final: tuple[bool, Any] = (False, None)
        self.final_lock = _thread.allocate_lock()
        #: Each code object's instruction positions (`where`), by id with the code kept alive; per program.
        self.positions: dict[int, tuple[Any, list[Any]]] = {}
        self.output = Output(1, int(init["max_output"]))
        sys.stdout = sys.stderr = self.output  # type: ignore[assignment,unused-ignore]
        imports = guard.ImportPolicy(init["imports"])
        table = guard.safe_builtins(imports, _ERRORS, allow_open=init["isolation"] == "bwrap")
        self.namespace: dict[str, Any] = {"__builtins__": table, "__name__": "__main__", "__doc__": None}
        for spec in init["tools"]:
            self.namespace[spec["name"]] = self.make_stub(spec)
        custom = init.get("final_tool")  # a tool computing the answer from final_answer()'s arguments
        self.namespace["final_answer"] = self.make_final_answer(self.make_stub(custom) if custom else None)

    # -- what the program calls ------------------------------------------------------------------

    def call(self, tool: str, args: dict[str, Any]) -> Any:
        if self.final[0]:
            raise FinalAnswer()
        if not self.active:
            raise proctor_errors.ProctorError(f"{tool}: tools can only be called while a program runs")
        if self.stale and _thread.get_ident() in self.stale:
            raise proctor_errors.ToolDenied(_STALE.format(tool), tool=tool)
        payload = args  # a fresh dict the stub built, keyed by parameter names: sent as is when flat
        for value in args.values():
            if type(value) not in SCALAR_TYPES:
                try:
                    payload = encode_value(args, "argument")
                except EncodeError as bad:
                    raise TypeError(f"{tool}: {bad}") from None
                break
        channel = self.channel
        rid = channel.next_id()
        if not channel.send_in_run(call_frame(rid, self.run_id, tool, payload, self.where())):
            raise proctor_errors.ProctorError(f"{tool}: tools can only be called while a program runs")
        reply = channel.wait(rid)
        if reply.get("ok"):
            value = reply.get("value")
            if type(value) in SCALAR_TYPES:
                return value
            try:
                return decode_value(value)
            except ProtocolError as exc:  # e.g. a DataFrame, pandas not importable here: the tool did run
                raise proctor_errors.ToolFailed(f"{tool}: ran, but its result cannot be used in the program: {exc}",
                                                tool=tool, error_type="ProtocolError") from None
        err = reply.get("error") or {}
        cls = _ERRORS.get(str(err.get("type")), proctor_errors.ProctorError)
        message = str(err.get("message", "the call failed"))
        extra = {k: err[k] for k in ("tool", "call_id") if isinstance(err.get(k), str)}
        raised: BaseException
        if issubclass(cls, proctor_errors.CallRefused):
            raised = cls(message, rules=tuple(err.get("rules") or ()), **extra)
            if isinstance(raised, proctor_errors.BudgetExceeded):
                raised.budget = str(err.get("budget", ""))
        elif issubclass(cls, proctor_errors.ToolFailed):
            raised = cls(message, error_type=str(err.get("error_type", "")), **extra)
        else:
            try:
                raised = cls(message)
            except TypeError:  # an error built from more than a message (ProgramError): its message is what counts
                raised = proctor_errors.ProctorError(message)
        raise raised

    def where(self) -> str:
        """Where the program made the call being sent: ``LINE:COL:END_LINE:END_COL`` of the innermost call
        expression in the program's own text (a helper the program defined, a lambda, a comprehension:
        the call inside it), or ``LINE`` where the interpreter keeps no columns; "" when no frame of the
        program is on the stack. The approval inbox marks that place, never every line naming the tool."""
        frame: Any = sys._getframe(2)  # noqa: SLF001 - the caller of the stub (1); CPython documents it
        hops = 0
        while frame is not None and frame.f_code.co_filename != PROGRAM:
            frame = frame.f_back
            hops += 1
            if hops > 64:
                return ""
        if frame is None:
            return ""
        code = frame.f_code
        known = self.positions.get(id(code))
        if known is None or known[0] is not code:
            listing = getattr(code, "co_positions", None)  # Python 3.11 and later
            known = self.positions[id(code)] = (code, list(listing()) if listing is not None else [])
        lasti = frame.f_lasti // 2
        if lasti < len(known[1]):
            line, end_line, col, end_col = known[1][lasti]
            if line is not None and end_line is not None and col is not None and end_col is not None:
                return f"{line}:{col}:{end_line}:{end_col}"
        return str(frame.f_lineno) if frame.f_lineno else ""

    def make_stub(self, spec: dict[str, Any]) -> Any:
        """Compile ``def name(a, b=DEFAULT, *, c=...): return call(name, {...})`` from the tool's data."""
        name = spec["name"]
        params, names, env = [], [], {"_proctor_call": self.call, "_proctor_missing": _MISSING}
        star = optional = False
        for i, p in enumerate(spec["params"]):
            pname = p["name"]
            if not pname.isidentifier() or not name.isidentifier():
                raise ValueError(f"bad parameter name {pname!r}")
            if p["kind"] == "KEYWORD_ONLY" and not star:
                params.append("*")
                star = True
            text = pname
            if "default" in p:
                env[f"_proctor_d{i}"] = decode_value(p["default"])
                text += f"=_proctor_d{i}"
            elif p.get("optional"):
                text += "=_proctor_missing"
                optional = True
            params.append(text)
            if p["kind"] == "POSITIONAL_ONLY" and (i + 1 == len(spec["params"])
                                                   or spec["params"][i + 1]["kind"] != "POSITIONAL_ONLY"):
                params.append("/")
            names.append(pname)
        body = ", ".join(f"{n!r}: {n}" for n in names)
        if optional:  # leave out the optional arguments the program did not pass
            call = "{k: v for k, v in args.items() if v is not _proctor_missing}"
        else:
            call = "args"
        source = (f"def {name}({', '.join(params)}):\n"
                  f"    args = {{{body}}}\n"
                  f"    return _proctor_call({name!r}, {call})\n")
        exec(compile(source, f"<tool {name}>", "exec"), env)
        stub = env[name]
        stub.__doc__ = spec.get("doc") or None
        stub.__annotations__ = dict(spec.get("annotations") or {})
        stub.__module__ = "tools"
        return stub

    def make_final_answer(self, custom: Any = None) -> Any:
        def final_answer(answer: Any) -> None:
            """End the program and give `answer` as its result."""
            if self.stale and _thread.get_ident() in self.stale:
                raise proctor_errors.ToolDenied(_STALE.format("final_answer"), tool="final_answer")
            with self.final_lock:  # two threads answering at once: the first one wins
                first = self.active and not self.final[0]
                if first:
                    self.final = (True, answer)
            if first:
                self.output.flush()
                message = {"t": "final", "run": self.run_id, "value": _encode_result(answer)}
                try:
                    data = self.channel.build(message)
                except EncodeError as exc:
                    message["value"] = f"<value not sendable: {exc}>"
                    data = self.channel.build(message)
                self.channel.send_in_run(data)
            raise FinalAnswer()

        if custom is None:
            return final_answer

        def final_answer_through_tool(*args: Any, **kwargs: Any) -> None:
            """End the program with what the final_answer tool makes of the arguments (a governed call)."""
            final_answer(custom(*args, **kwargs))

        final_answer_through_tool.__name__ = "final_answer"
        final_answer_through_tool.__doc__ = custom.__doc__ or final_answer_through_tool.__doc__
        return final_answer_through_tool

    # -- running ---------------------------------------------------------------------------------

    def run(self, code: str, previous: int, variables: Any = None) -> dict[str, Any]:
        self.final = (False, None)
        self.output.reset()
        self.positions = {}
        value: Any = None
        error = None
        self._mark_stale(previous)
        self.active = True
        self.channel.open_run()
        try:
            if variables is not None:  # the host's, checked there: plain identifiers
                decoded = decode_value(variables)
                if not isinstance(decoded, dict):
                    raise TypeError("the variables sent are not a mapping")
                for name, item in decoded.items():
                    if isinstance(name, str) and name.isidentifier() and not name.startswith("__"):
                        self.namespace[name] = item
            tree = compile(code, PROGRAM, "exec", _ast.PyCF_ONLY_AST)
            assert isinstance(tree, _ast.Module)
            guard.check_program(tree)
            program.describe_asserts(tree, code)
            program.note_last_value(tree)
            box, self.namespace[program.NOTE] = program.recorder()
            try:
                exec(compile(tree, PROGRAM, "exec"), self.namespace)
            finally:
                value = box[0]
        except FinalAnswer:
            pass
        except BaseException as exc:  # noqa: BLE001 - every failure of the program is its result
            error = _describe(exc)
        finally:
            self.channel.close_run()  # from here on no thread can send a call or an answer for this run
            self.active = False
        final, answer = self.final
        if final:
            value, error = answer, None
        self.output.flush()
        return {"t": "done", "run": self.run_id, "value": _encode_result(value), "error": error,
                "final": final, "cut": self.output.cut}

    def _mark_stale(self, previous: int) -> None:
        """Remember the threads earlier programs left running: they may not call tools in this one."""
        main = _thread.get_ident()
        # Every live thread, `_thread.start_new_thread`'s included (`threading.enumerate` misses those): the
        # documented CPython call for it is underscored.
        alive = sys._current_frames()  # noqa: SLF001 - the only list of every thread, see above
        for ident in [i for i in self.stale if i not in alive]:
            del self.stale[ident]
        for ident in alive:
            if ident != main and ident not in self.stale:
                self.stale[ident] = previous

    def loop(self) -> None:
        while True:
            message = self.channel.wait("ctl")
            if message.get("t") != "run":
                continue
            # The run's key proves a done came from here, not from a program writing on the channel.
            key = message.pop("key", None)
            previous, self.run_id = self.run_id, int(message["run"])
            seed = message.pop("seed", None)
            if type(seed) is int:  # a durable run re-runs programs: the same seed, the same random numbers
                import random

                random.seed(seed)
            try:
                result = self.run(str(message.pop("code")), previous, message.pop("vars", None))
            except BaseException as exc:  # noqa: BLE001 - e.g. MemoryError while reporting: still answer
                self.channel.close_run()
                self.active = False
                result = {"t": "done", "run": self.run_id, "value": None, "final": False, "cut": True,
                          "error": {"type": type(exc).__name__, "message": "the worker failed to report", "line": None}}
            result["key"] = key
            del message, key
            try:
                self.channel.send(result)
            except EncodeError as exc:  # a value JSON refuses (a 5000-digit int): send what it looks like
                result["value"] = f"<value not sendable: {exc}>"
                self.channel.send(result)


class _Missing:
    def __repr__(self) -> str:
        return "<default>"


_MISSING = _Missing()


def _encode_result(value: Any) -> Any:
    try:
        return encode_value(value)
    except EncodeError:
        try:
            return repr(value)[:100_000]
        except Exception as exc:  # noqa: BLE001 - a broken __repr__ must not break the run
            return f"<unrepresentable {type(value).__name__}: {type(exc).__name__}>"


def _describe(exc: BaseException) -> dict[str, Any]:
    """Type, message and the program's line where it was raised."""
    line = getattr(exc, "lineno", None) if isinstance(exc, (SyntaxError, guard.InterpreterError)) else None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == PROGRAM:
            line = tb.tb_lineno
        tb = tb.tb_next
    try:
        message = str(exc) if not isinstance(exc, SyntaxError) else _syntax_message(exc)
    except Exception:  # noqa: BLE001 - a broken __str__
        message = "<unprintable message>"
    return {"type": type(exc).__name__, "message": message[:10_000], "line": line}


def _syntax_message(exc: SyntaxError) -> str:
    """The parser's message, then the offending line with a caret under where it stopped."""
    message = str(exc.msg)
    text = (exc.text or "").rstrip("\n")
    if not text.strip():
        return message
    stripped = text.lstrip()
    caret = max(0, (exc.offset or 1) - 1 - (len(text) - len(stripped)))
    return f"{message}\n    {stripped}\n    {' ' * min(caret, len(stripped))}^"


def _apply_limits(limits: dict[str, int]) -> None:
    import resource

    for name, value in limits.items():
        which = getattr(resource, name, None)
        if which is None:
            continue
        _, hard = resource.getrlimit(which)
        new = value if hard == resource.RLIM_INFINITY else min(value, hard)
        try:
            resource.setrlimit(which, (new, new))
        except (ValueError, OSError):  # e.g. RLIMIT_AS on macOS; on Linux every limit applies
            continue


def main(fd_in: int, fd_out: int) -> None:
    # Move the channel to unguessable fd numbers; user code finding them is harmless (the host
    # gates whatever arrives), but it should not be trivial.
    # (Below 1000: the usual soft limit on open files is 1024. Neither on the other's old number.)
    hidden = hidden_out = fd_in
    while hidden in (fd_in, fd_out):
        hidden = 200 + int.from_bytes(os.urandom(2), "big") % 400
    while hidden_out in (fd_in, fd_out, hidden):
        hidden_out = 600 + int.from_bytes(os.urandom(2), "big") % 400
    for fd, to in ((fd_in, hidden), (fd_out, hidden_out)):
        os.dup2(fd, to, inheritable=False)
        os.close(fd)
    channel = Channel(hidden, hidden_out)
    init = channel.wait("ctl")
    if init.get("t") != "init":
        os._exit(3)
    if init.get("sys_path"):
        sys.path.extend(str(p) for p in init["sys_path"])
    _apply_limits({str(k): int(v) for k, v in init.get("limits", {}).items()})
    bounds = init.get("channel") or {}  # what the host accepts: send nothing over it
    _channel.MAX_MESSAGE = int(bounds.get("max_frame_bytes", _channel.MAX_MESSAGE))
    _channel.MAX_DEPTH = int(bounds.get("max_depth", _channel.MAX_DEPTH))
    _channel.MAX_CONTAINERS = int(bounds.get("max_containers", _channel.MAX_CONTAINERS))
    _channel.MAX_VALUES = int(bounds.get("max_values", _channel.MAX_VALUES))
    worker = Worker(channel, init)
    channel.send({"t": "ready", "pid": os.getpid()})
    worker.loop()
