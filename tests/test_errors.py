"""Tests for proctor.errors: the tree and its messages."""

from __future__ import annotations

import inspect

import proctor.errors as errors
from proctor.errors import PolicyError, PolicyIssue


def test_every_error_derives_from_proctor_error() -> None:
    """Every exception class exported derives from ProctorError."""
    for name in errors.__all__:
        obj = getattr(errors, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
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
