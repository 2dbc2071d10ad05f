"""path_normalize() and path_within(): lexical POSIX paths, against os.path.normpath and PurePosixPath."""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiers import examples

from proctor import Gate, Policy, tool
from proctor.calls import Call
from proctor.errors import ToolDenied
from proctor.policy.functions import path_normalize, path_within

_PARTS = st.sampled_from(["a", "b", "out", ".", "..", "", "%2e%2e", "...", "a b"])
_PATHS = st.builds(lambda lead, parts, tail: lead + "/".join(parts) + tail,
                   st.sampled_from(["", "/", "//", "///", "./", "../"]), st.lists(_PARTS, max_size=8),
                   st.sampled_from(["", "/", "//", "/."]))


def _nonempty(path: str) -> bool:
    return path != ""


@settings(max_examples=examples(500), deadline=None)
@given(path=_PATHS.filter(_nonempty))
def test_normalize_is_normpath_with_a_leading_double_slash_as_one(path: str) -> None:
    """As os.path.normpath on POSIX, except that '//x' is '/x' (as Linux reads it)."""
    expected = posixpath.normpath(re.sub(r"^/+", "/", path))
    assert path_normalize(path) == expected
    assert path_normalize(expected) == expected  # idempotent


@settings(max_examples=examples(500), deadline=None)
@given(path=_PATHS.filter(_nonempty))
def test_normalize_agrees_with_purepath_on_what_purepath_folds(path: str) -> None:
    """PurePosixPath folds '.', repeated and trailing separators (not '..'): folding first changes nothing."""
    assert path_normalize(str(PurePosixPath(path))) == path_normalize(path)


@settings(max_examples=examples(500), deadline=None)
@given(path=_PATHS.filter(_nonempty), root=st.sampled_from(["/", "/srv", "/srv/out", "/srv/out/", "//srv/out",
                                                            "/srv/./out", "/srv/x/../out"]))
def test_within_is_lexical_containment(path: str, root: str) -> None:
    """For absolute paths: os.path.commonpath and PurePosixPath.is_relative_to of the normalised paths agree."""
    norm_root = path_normalize(root)
    norm = path_normalize(path)
    if not norm.startswith("/"):
        assert path_within(path, root) is False  # relative to a working directory the policy does not see
        return
    assert path_within(path, root) == (os.path.commonpath([norm, norm_root]) == norm_root)
    assert path_within(path, root) == PurePosixPath(norm).is_relative_to(PurePosixPath(norm_root))


@pytest.mark.parametrize(("path", "within"), [
    ("/srv/out/report.txt", True),
    ("/srv/out", True),
    ("/srv/out/", True),
    ("/srv/out//a///b/", True),
    ("//srv/out/x", True),
    ("/srv/out/%2e%2e/x", True),  # a directory named '%2e%2e': nothing is decoded, and it *is* inside
    ("/srv/out/../private", False),
    ("/srv/out/../private/key.txt", False),
    ("/srv/out/./../x", False),
    ("/srv/out/a/../../x", False),
    ("/srv/outside", False),
    ("/srv/out-2/x", False),
    ("/srv/ou", False),
    ("out/x", False),
    ("../srv/out/x", False),
    ("srv/out", False),
])
def test_attack_variants(path: str, within: bool) -> None:
    """The issue's variants, and their neighbours."""
    assert path_within(path, "/srv/out") is within


@pytest.mark.parametrize(("value", "why"), [
    ("", "empty"), ("/srv/out/a\x00/../../etc", "NUL byte"), (5, "got int"), (None, "got null"),
    (["/srv/out"], "got list"), ({"p": "/srv/out"}, "got map"), (True, "got bool"),
])
def test_non_paths_fail_closed_naming_why(value: Any, why: str) -> None:
    """A value that is no usable path denies the call, and the reason says why."""
    for rule in ({"decision": "allow", "when": "path_within(args.path, '/srv/out')"},
                 {"decision": "deny", "when": "!path_within(args.path, '/srv/out')"}):
        policy = Policy.from_dict({"version": 1, "default": "allow" if rule["decision"] == "deny" else "deny",
                                   "rules": [{"name": "r", **rule}]})
        decision = policy.decide(Call("write_file", {"path": value}))
        assert decision.outcome == "deny"
        assert why in decision.reason and "path_within" in decision.reason
        assert not decision.reason.rstrip().endswith(":")


def test_roots_as_a_list_and_relative_roots() -> None:
    """A list of roots is any of them; '.' holds every relative path that does not climb above it."""
    assert path_within("/tmp/job/x", ["/srv/out", "/tmp/job"])
    assert not path_within("/tmp/jobs", ["/srv/out", "/tmp/job"])
    assert path_within("a/b", ".") and path_within("./a/../b", ".") and path_within(".", ".")
    assert not path_within("../a", ".") and not path_within("/a", ".")
    assert path_within("/", "/") and path_within("/etc", "//")
    with pytest.raises(ValueError, match="empty"):
        path_within("/a", [])


@tool(side_effect="write")
def write_file(path: str, text: str) -> str:
    """Write a file.

    Args:
        path: Where.
        text: What.
    """
    return "written"


def test_the_gate_confines_writes() -> None:
    """The issue's write_file('/srv/out/../private/key.txt'), through a gate: refused; an honest path runs."""
    policy = Policy.from_dict({"version": 1, "rules": [
        {"name": "writes-stay-in-out", "match": {"tool": "write_file"},
         "when": "path_within(args.path, '/srv/out')", "decision": "allow"}]})
    gate = Gate(policy, tools=[write_file])
    ctx = gate.start_run()
    assert gate.call("write_file", {"path": "/srv/out/report.txt", "text": "x"}, context=ctx) == "written"
    for attack in ("/srv/out/../private/key.txt", "/srv/out/./../x", "/srv/outside/x", "srv/out/x"):
        with pytest.raises(ToolDenied):
            gate.call("write_file", {"path": attack, "text": "x"}, context=ctx)


def test_symlinks_are_the_tools_business(tmp_path: Path) -> None:
    """path_within is lexical: a link inside the root passes it; the tool's realpath + commonpath check (as
    docs/policy.md shows) is what stops it."""
    root = tmp_path / "out"
    root.mkdir()
    (tmp_path / "private").mkdir()
    (root / "link").symlink_to(tmp_path / "private")
    target = str(root / "link" / "key.txt")
    assert path_within(target, str(root))  # lexically inside
    real = os.path.realpath(target)
    assert os.path.commonpath([real, os.path.realpath(root)]) != os.path.realpath(root)  # really outside


def test_the_dotted_spelling_is_the_same_function() -> None:
    """path.within(p, root) and path.normalize(p) read as path_within / path_normalize; a macro variable named
    `path` keeps its own methods."""
    policy = Policy.from_dict({"version": 1, "rules": [
        {"name": "r", "when": "path.within(args.path, '/srv/out') && path.normalize(args.path) != '/srv/out/x'",
         "decision": "allow"}]})
    assert policy.decide(Call("t", {"path": "/srv/out/y"})).outcome == "allow"
    assert policy.decide(Call("t", {"path": "/srv/out/../y"})).outcome == "deny"
    assert policy.decide(Call("t", {"path": "/srv/out/./x"})).outcome == "deny"
    assert policy.rules[0].when is not None and policy.compiled[0].condition is not None
    assert policy.compiled[0].condition.source == policy.rules[0].when  # shown as written
    bound = Policy.from_dict({"version": 1, "default": "allow", "rules": [
        {"name": "r", "when": "args.paths.exists(path, path.normalize() == 'x')", "decision": "deny"}]})
    assert bound.decide(Call("t", {"paths": ["X"]})).outcome == "deny"  # normalize() of the bound string
