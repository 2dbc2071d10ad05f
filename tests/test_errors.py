"""Tests for proctor.errors: the tree and its messages."""

from __future__ import annotations

import ast
import functools
import inspect
from types import ModuleType

import pytest
from proctor_modules import import_or_absent_extra, module_names, parsed

import proctor.errors as errors
from proctor.errors import PolicyError, PolicyIssue


def test_every_error_derives_from_proctor_error() -> None:
    """Every exception class exported derives from ProctorError, but the two signals (below)."""
    for name in errors.__all__:
        obj = getattr(errors, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException) and name not in SIGNALS:
            assert issubclass(obj, errors.ProctorError), name


def test_all_is_complete() -> None:
    """__all__ lists every public class of the module."""
    public = {n for n, o in vars(errors).items() if inspect.isclass(o) and o.__module__ == errors.__name__}
    assert public == set(errors.__all__)


def test_docstring_draws_every_error() -> None:
    """The module docstring's tree names every exception class."""
    doc = errors.__doc__ or ""
    for name in errors.__all__:
        obj = getattr(errors, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            assert name in doc, name


def test_refusals_share_a_base() -> None:
    """except CallRefused catches every call that did not run."""
    for cls in (errors.ToolDenied, errors.ApprovalDenied, errors.ApprovalTimeout, errors.BudgetExceeded):
        assert issubclass(cls, errors.CallRefused)
    assert not issubclass(errors.ToolFailed, errors.CallRefused)


def test_policy_error_locates_every_issue() -> None:
    """A PolicyError prints file:line:col: message for each issue and exposes the first."""
    err = PolicyError([PolicyIssue("p.yaml", 3, 5, "bad"), PolicyIssue("p.yaml", 9, 1, "worse")])
    assert str(err) == "p.yaml:3:5: bad\np.yaml:9:1: worse"
    assert (err.file, err.line, err.column) == ("p.yaml", 3, 5)


# -- every exception class proctor defines lives in errors.py, under ProctorError ------------------------

#: Signals, not errors: BaseExceptions on purpose, so that no `except Exception` swallows them.
SIGNALS = {"FinalAnswer", "Terminated"}


def _imported_modules() -> tuple[list[ModuleType], list[str]]:
    modules: list[ModuleType] = []
    absent: list[str] = []
    for name in module_names():
        got = import_or_absent_extra(name)
        if isinstance(got, str):
            absent.append(got)
        else:
            modules.append(got)
    return modules, absent


def _subclasses(cls: type[BaseException]) -> set[type[BaseException]]:
    seen: set[type[BaseException]] = set()
    stack = [cls]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
    return seen


@functools.cache
def _names_reached(name: str) -> frozenset[str]:
    """The names a module imports from others or reads as attributes."""
    tree = parsed(name)
    names: set[str] = set()
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.name for alias in node.names)
    return frozenset(names)


def _names_used_outside(module: str, name: str) -> list[str]:
    """Modules of proctor other than `module` that import `name` or read it as an attribute."""
    return [other for other in module_names() if other != module and name in _names_reached(other)]


@pytest.mark.parametrize("name", module_names())
def test_every_module_imports(name: str) -> None:
    """Each module under proctor/ imports; one is skipped only when the optional extra it needs is absent."""
    got = import_or_absent_extra(name)
    if isinstance(got, str):
        pytest.skip(got)


def test_every_exception_class_in_proctor_is_defined_in_errors_under_proctor_error() -> None:
    """Importing every module, then walking every BaseException subclass Python knows: each one defined in
    proctor is defined in proctor.errors and derives from ProctorError (the signals aside), or is a private
    one (`_Name`) that no other module imports or reads, i.e. control flow inside its own module."""
    _imported_modules()
    misplaced = []
    for cls in _subclasses(BaseException):
        module = cls.__module__
        if not (module == "proctor" or module.startswith("proctor.")):
            continue
        if module == "proctor.errors":
            if cls.__name__ in SIGNALS:
                assert not issubclass(cls, Exception), cls.__name__
            elif not issubclass(cls, errors.ProctorError):
                misplaced.append(f"{cls.__qualname__} (proctor.errors) does not derive from ProctorError")
            continue
        if cls.__name__.startswith("_"):
            users = _names_used_outside(module, cls.__name__)
            if users:
                misplaced.append(f"{module}.{cls.__qualname__} is private yet used by {users}: move it to errors.py")
            continue
        misplaced.append(f"{module}.{cls.__qualname__}: define it in proctor/errors.py (under ProctorError) "
                         f"and import it from there")
    assert misplaced == []


def test_the_signals_are_exactly_the_non_errors() -> None:
    """errors.py holds exactly two classes outside ProctorError, both past `except Exception` by design."""
    outside = {name for name in errors.__all__
               if inspect.isclass(obj := getattr(errors, name)) and issubclass(obj, BaseException)
               and not issubclass(obj, errors.ProctorError)}
    assert outside == SIGNALS
    assert issubclass(errors.Terminated, SystemExit)


def test_moved_errors_keep_the_names_users_import() -> None:
    """The exceptions that moved into errors.py are still importable where they were, as the same class."""
    from proctor.approval.signing import SignatureError
    from proctor.halt import HaltError
    from proctor.interpreter import ProgramError
    from proctor.interpreter.channel import EncodeError, ProtocolError
    from proctor.interpreter.guard import InterpreterError
    from proctor.interrupts import Terminated
    from proctor.policy.conditions import ConditionError, EvaluationError
    from proctor.policy.simulate import SimulationError

    assert (HaltError, SimulationError, ProgramError, SignatureError, ConditionError, EvaluationError,
            EncodeError, ProtocolError, InterpreterError, Terminated) == (
        errors.HaltError, errors.SimulationError, errors.ProgramError, errors.SignatureError,
        errors.ConditionError, errors.EvaluationError, errors.EncodeError, errors.ProtocolError,
        errors.InterpreterError, errors.Terminated)
