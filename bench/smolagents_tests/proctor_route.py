"""A pytest plugin routing smolagents' executor tests through proctor's `Interpreter`.

Loaded with ``-p proctor_route`` before smolagents' own ``tests/test_local_python_executor.py``
(vendored next to this file) is imported, it replaces the two entry points those tests drive —
``evaluate_python_code`` and ``LocalPythonExecutor`` — with versions that run each program in
proctor's sandboxed worker. Tools are the tests' own Python functions, registered on an
allow-all gate (functions without docstrings are taken leniently, with untyped arguments); the
tests' ``state`` dicts are sent in as data and read back after the run (values that are not
data come back as their repr, as they cross a process boundary). Errors are raised as
smolagents' ``InterpreterError`` (``ExecutionTimeoutError`` for a timeout) with proctor's message.

Each test's report says whether it was routed (it called one of the two entry points) and, for
a failure, whether only an error message's wording differed (a ``match=`` or an ``in str(e)``
check on an error that was raised as expected).
"""

from __future__ import annotations

import ast
import inspect
import json
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import pydantic
import pytest
import smolagents.local_python_executor as lpe
from smolagents.default_tools import FinalAnswerTool

from proctor.errors import ProctorError
from proctor.gate import Gate
from proctor.interpreter import Interpreter
from proctor.policy import Policy
from proctor.tools import Tool

# The same harness measures proctor before this integration existed (no final_answer=, no lenient tools).
_HAS_FINAL = "final_answer" in inspect.signature(Interpreter.__init__).parameters
_HAS_VARIABLES = "variables" in inspect.signature(Interpreter.run).parameters
#: Modules whose values the channel carries as themselves (where this proctor's channel has the codec for them).
_RICH_MODULES = ("numpy", "pandas", "datetime", "decimal", "PIL") if _HAS_VARIABLES else ()


def _crosses(value: Any) -> bool:
    """Whether the channel carries `value` as itself."""
    from proctor.interpreter.channel import EncodeError, encode_value

    try:
        encode_value(value)
    except (EncodeError, RecursionError):
        return False
    return True

SANDBOX = os.environ.get("PROCTOR_ROUTE_SANDBOX", "auto")
MAX_TIMEOUT = 5.0  # seconds a routed program may run (smolagents' default is 30; no test needs more than 5)
ROUTED: list[int] = [0]
RESULTS: dict[str, dict[str, Any]] = {}
LIVE: list[_Routed] = []  # closed at the end of the session: no worker outlives it
_MATH = {name for name in dir(math) if not name.startswith("_")}
_BUILTINS = __builtins__ if isinstance(__builtins__, dict) else vars(__builtins__)


def _literal(value: Any, depth: int = 0) -> str:
    """Python source rebuilding `value` when it is data; otherwise its repr, as a string."""
    kind = type(value)
    if value is None or kind in (bool, int, str, bytes):
        return repr(value)
    if kind is float:
        return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
    if depth < 50 and kind in (list, tuple, set, frozenset, dict):
        if kind is dict:
            pairs = (f"{_literal(k, depth + 1)}: {_literal(v, depth + 1)}" for k, v in value.items())
            return "{" + ", ".join(pairs) + "}"
        items = ", ".join(_literal(v, depth + 1) for v in value)
        if kind is list:
            return f"[{items}]"
        if kind is tuple:
            return f"({items}{',' if len(value) == 1 else ''})"
        return f"{kind.__name__}([{items}])"
    try:
        return repr(repr(value))
    except Exception:
        return repr(f"<{kind.__name__}>")


def _lenient(name: str, fn: Callable[..., Any]) -> Tool | None:
    """A proctor tool of any Python callable the tests hand over (no docstring or types needed)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in signature.parameters.values()):
        return None
    fields = {p.name: (Any, pydantic.Field(... if p.default is p.empty else p.default))
              for p in signature.parameters.values()}
    plain = signature.replace(parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
                              return_annotation=inspect.Signature.empty)
    try:
        model = pydantic.create_model(f"{name}_args", __config__=pydantic.ConfigDict(extra="forbid"), **fields)
        return Tool(name=name, description=f"the test's {name}", fn=fn, side_effect="none", cost=0,
                    parameters=model.model_json_schema(), signature=plain, arg_descriptions={},
                    _validator=model.__pydantic_validator__)
    except Exception:
        return None


class _Routed:
    """One proctor interpreter standing in for smolagents' executor, with a tests-visible `state`."""

    def __init__(self, tools: dict[str, Any], imports: list[str], timeout: float | None,
                 max_output: int | None) -> None:
        ROUTED[0] += 1
        converted: list[Tool] = []
        self.prelude: list[str] = []
        final: Tool | None = None
        for name, obj in tools.items():
            if name == "final_answer":
                if not (isinstance(obj, FinalAnswerTool) and type(obj).forward is FinalAnswerTool.forward):
                    final = _lenient(name, obj)
                continue
            if _BUILTINS.get(name) is obj or name == "print" or (name == "getattr" and obj is getattr):
                continue
            if name in _MATH and obj is getattr(math, name, None):
                self.prelude.append(f"from math import {name}")
                continue
            tool = _lenient(name, obj)
            if tool is not None:
                converted.append(tool)
        gate = Gate(Policy.from_dict({"version": 1, "default": "allow"}))
        try:
            self.interpreter = Interpreter(converted, gate, timeout=min(float(timeout or 30), MAX_TIMEOUT),
                                           sandbox=SANDBOX, authorized_imports=list(imports),
                                           max_output=max_output or 50_000,
                                           **({"final_answer": final} if _HAS_FINAL else {}))
        except ProctorError as exc:
            raise lpe.InterpreterError(str(exc)) from None
        self.state: dict[str, Any] = {"__name__": "__main__"}
        self.known: set[str] = set()
        LIVE.append(self)

    def send(self, variables: dict[str, Any]) -> None:
        lines = [*self.prelude]
        self.prelude = []
        sent: dict[str, Any] = {}
        for name, value in variables.items():
            if isinstance(name, str) and name.isidentifier() and not name.startswith("__") and name != "_print_outputs":
                if _HAS_VARIABLES and _crosses(value):
                    sent[name] = value  # as the object it is (the channel's codec: DataFrames, arrays, dates…)
                else:
                    lines.append(f"{name} = {_literal(value)}")
                self.known.add(name)
        if lines or sent:
            extra = {"variables": sent} if sent else {}
            result = self.interpreter.run("\n".join(lines) + "\nNone", **extra)
            if result.error is not None:
                raise lpe.InterpreterError(str(result.error))

    def run(self, code: str) -> tuple[Any, str, bool]:
        result = self.interpreter.run(code)
        logs = result.logs
        self.known |= _assigned(code)
        self._read_back()
        printed = lpe.PrintContainer()
        printed.value = logs
        self.state["_print_outputs"] = printed
        if result.error is not None:
            if type(result.error).__name__ == "ExecutionTimeout":
                raise lpe.ExecutionTimeoutError(str(result.error))
            raise lpe.InterpreterError(str(result.error))
        return result.value, logs, result.is_final_answer

    def _read_back(self) -> None:
        names = sorted(n for n in self.known if n.isidentifier() and not n.startswith("__"))
        if not names:
            return
        lines = ["def _proctor_data(v, depth=0):",
                 "    if v is None or type(v) in (bool, int, float, str, bytes) or depth > 50:",
                 "        return v",
                 f"    if type(v).__module__.partition('.')[0] in {_RICH_MODULES!r}:",
                 "        return v",
                 "    if type(v) in (list, tuple, set, frozenset):",
                 "        return type(v)(_proctor_data(x, depth + 1) for x in v)",
                 "    if type(v) is dict:",
                 "        return {_proctor_data(k, depth + 1): _proctor_data(x, depth + 1) for k, x in v.items()}",
                 "    return repr(v)",
                 "_proctor_state = {}"]
        for n in names:
            lines += ["try:", f"    _proctor_state[{n!r}] = _proctor_data({n})", "except NameError:", "    pass"]
        result = self.interpreter.run("\n".join(lines) + "\n_proctor_state")
        if result.error is None and isinstance(result.value, dict):
            self.state.update(result.value)

    def close(self) -> None:
        self.interpreter.close()


def _assigned(code: str) -> set[str]:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names)
    return names


def evaluate_python_code(code: str, static_tools: dict[str, Any] | None = None,
                         custom_tools: dict[str, Any] | None = None, state: dict[str, Any] | None = None,
                         authorized_imports: list[str] = lpe.BASE_BUILTIN_MODULES,
                         max_print_outputs_length: int = lpe.DEFAULT_MAX_LEN_OUTPUT,
                         timeout_seconds: int | None = lpe.MAX_EXECUTION_TIME_SECONDS) -> tuple[Any, bool]:
    """smolagents' `evaluate_python_code`, each call run in a fresh proctor worker."""
    routed = _Routed({**(static_tools or {}), **(custom_tools or {})}, list(authorized_imports), timeout_seconds,
                     max_print_outputs_length)
    try:
        if state is None:
            state = {}
        routed.send(state)
        routed.state = state
        value, _, final = routed.run(code)
        return value, final
    finally:
        routed.close()


class LocalPythonExecutor(lpe.PythonExecutor):
    """smolagents' `LocalPythonExecutor`, its programs run in one persistent proctor worker."""

    def __init__(self, additional_authorized_imports: list[str], max_print_outputs_length: int | None = None,
                 additional_functions: dict[str, Any] | None = None,
                 timeout_seconds: int | None = lpe.MAX_EXECUTION_TIME_SECONDS) -> None:
        self.additional_authorized_imports = additional_authorized_imports
        self.authorized_imports = list(set(lpe.BASE_BUILTIN_MODULES) | set(additional_authorized_imports))
        self.additional_functions = additional_functions or {}
        self.max_print_outputs_length = max_print_outputs_length
        self.timeout_seconds = timeout_seconds
        self._routed = _Routed(dict(self.additional_functions), self.authorized_imports, timeout_seconds,
                               max_print_outputs_length)
        self.state = self._routed.state
        self._pending: dict[str, Any] = {}

    def send_tools(self, tools: dict[str, Any]) -> None:
        self._routed.close()
        self._routed = _Routed({**tools, **self.additional_functions}, self.authorized_imports, self.timeout_seconds,
                               self.max_print_outputs_length)
        self._routed.send({k: v for k, v in self.state.items() if k != "_print_outputs"})
        self._routed.state = self.state

    def send_variables(self, variables: dict[str, Any]) -> None:
        self.state.update(variables)
        self._routed.send(variables)

    def __call__(self, code_action: str) -> lpe.CodeOutput:
        value, logs, final = self._routed.run(code_action)
        return lpe.CodeOutput(output=value, logs=logs, is_final_answer=final)

    def __del__(self) -> None:
        routed = getattr(self, "_routed", None)
        if routed is not None:
            routed.close()


def pytest_configure(config: pytest.Config) -> None:
    """Route before the tests' module imports smolagents' names (or, natively, only count the calls)."""
    if os.environ.get("PROCTOR_ROUTE_NATIVE"):
        original, native_class = lpe.evaluate_python_code, lpe.LocalPythonExecutor

        def counted(*args: Any, **kwargs: Any) -> Any:
            ROUTED[0] += 1
            return original(*args, **kwargs)

        class Counted(native_class):  # type: ignore[misc,valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                ROUTED[0] += 1
                super().__init__(*args, **kwargs)

        lpe.evaluate_python_code = counted  # type: ignore[assignment]
        lpe.LocalPythonExecutor = Counted  # type: ignore[misc]
        return
    lpe.evaluate_python_code = evaluate_python_code  # type: ignore[assignment]
    lpe.LocalPythonExecutor = LocalPythonExecutor  # type: ignore[assignment,misc]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    before = ROUTED[0]
    try:
        return (yield)
    finally:
        RESULTS.setdefault(item.nodeid, {})["routed"] = ROUTED[0] > before


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report: pytest.TestReport = yield
    entry = RESULTS.setdefault(item.nodeid, {})
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        entry["outcome"] = report.outcome
        if report.failed:
            text = str(report.longrepr)
            entry["wording"] = _wording_only(text)
            entry["reason"] = _last_error_line(text)
    return report


def _wording_only(text: str) -> bool:
    """The test expected an error, got one, and only its message's text differed — or a state dict
    differed only by smolagents' internal operation counter (``_operations_count``)."""
    if "Regex pattern did not match" in text:
        return True
    if "_operations_count" in text and "more item" in text and "Differing items" not in text:
        return True
    lines = [ln for ln in text.splitlines() if ln.startswith(">")]
    last = lines[-1] if lines else ""
    return "assert" in last and " in str(" in last and ("e.value" in last or "str(e)" in last or "exc" in last)


def _last_error_line(text: str) -> str:
    errors = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    return errors[0][:200] if errors else ""


def pytest_sessionfinish(session: pytest.Session) -> None:
    for routed in LIVE:
        routed.close()
    path = os.environ.get("PROCTOR_ROUTE_RESULTS")
    if path:
        with open(path, "w") as fh:
            json.dump(RESULTS, fh, indent=1, sort_keys=True)
