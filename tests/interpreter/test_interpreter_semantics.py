"""Behaviour smolagents users rely on, in proctor's own interpreter: values, error messages, imports."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ISOLATIONS, needs_bwrap

from proctor.errors import ConfigurationError
from proctor.interpreter import Interpreter

LAST_VALUES = [
    ("x = 3", 3),
    ("x = 3\nx += 2", 5),
    ("d = {'a': 1}\nd['a'] += 5", 6),
    ("n: int = 4", 4),
    ("a, b = 1, 2", (1, 2)),
    ("x = 2\nif x > 1:\n    y = 10\n    print('hi')\nelse:\n    y = 0", 10),
    ("for i in range(3):\n    z = i * 2", 4),
    ("x = 0\nwhile x < 7:\n    x += 1", 7),
    ("try:\n    w = 1 / 0\nexcept ZeroDivisionError:\n    w = 'caught'", "caught"),
    ("class C:\n    def __enter__(self):\n        return self\n    def __exit__(self, *a):\n        return False\n"
     "with C():\n    v = 'inside'", "inside"),
    ("print('no value')", None),
    ("x = 5\nx", 5),
]


@pytest.mark.parametrize(("code", "expected"), LAST_VALUES)
def test_the_last_statement_gives_the_value_smolagents_gives(make: Callable[..., Interpreter], code: str,
                                                             expected: object) -> None:
    """Assignments and the last statement inside compound statements give their value, as in smolagents."""
    r = make(sandbox="process").run(code)
    assert r.error is None, r.error
    assert r.value == expected or (isinstance(expected, tuple) and r.value == list(expected))


def test_an_error_names_the_failing_line_and_its_source(make: Callable[..., Interpreter]) -> None:
    """A runtime error says which line failed and shows it."""
    r = make(sandbox="process").run("y = [1,\n     2]\nz = y[5]")
    assert str(r.error) == "IndexError: list index out of range (line 3: z = y[5])"


def test_a_bare_assert_says_what_it_asserted(make: Callable[..., Interpreter]) -> None:
    """A failing `assert` without a message gives its expression."""
    r = make(sandbox="process").run("x = 1\nassert x == 99")
    assert r.error is not None and "AssertionError: Assertion failed: x == 99" in str(r.error)
    r = make(sandbox="process").run("def f(v):\n    assert v > 0, 'positive please'\n    return v\nf(-1)")
    assert r.error is not None and "AssertionError: positive please" in str(r.error)


def test_a_syntax_error_shows_the_line_with_a_caret(make: Callable[..., Interpreter]) -> None:
    """A SyntaxError points at where the parser stopped."""
    r = make(sandbox="process").run("a = 1\nx = = 1")
    assert str(r.error) == "SyntaxError: invalid syntax (line 2)\n    x = = 1\n        ^"


def test_an_authorized_import_that_is_not_installed_is_refused_at_construction(
        make: Callable[..., Interpreter]) -> None:
    """Naming a module that is not installed fails when the interpreter is built, not in the program."""
    with pytest.raises(ConfigurationError, match="no_such_module_xyz, not installed"):
        make(sandbox="process", authorized_imports=["no_such_module_xyz.sub"])


@pytest.mark.parametrize("sandbox", ISOLATIONS)
def test_star_allows_installed_third_party_packages(make: Callable[..., Interpreter], sandbox: str) -> None:
    """authorized_imports=['*'] reaches installed third-party packages, in the sandbox too."""
    r = make(sandbox=sandbox, authorized_imports=["*"]).run("import yaml\nyaml.safe_load('a: 1')")
    assert r.error is None, r.error
    assert r.value == {"a": 1}


@pytest.mark.parametrize("sandbox", ISOLATIONS)
def test_module_views_show_public_dunders_but_not_private_names(make: Callable[..., Interpreter],
                                                                sandbox: str) -> None:
    """`__version__` of an authorized module is readable; its private names stay hidden."""
    py = make(sandbox=sandbox, authorized_imports=["yaml"])
    r = py.run("import yaml\nyaml.__version__")
    assert r.error is None and r.value == __import__("yaml").__version__
    r = py.run("import random\nrandom._os")
    assert r.error is not None and "AttributeError" in str(r.error)


@pytest.fixture
def tmp_package(tmp_path: Path) -> Path:
    """A package in a directory under /tmp (as a virtualenv there would be) on sys.path."""
    root = tmp_path / "site"
    (root / "tmp_pkg_for_proctor").mkdir(parents=True)
    (root / "tmp_pkg_for_proctor" / "__init__.py").write_text("__version__ = '1.2.3'\nVALUE = 42\n")
    sys.path.insert(1, str(root))  # not sys.path[0], which is the script's own directory and stays private
    yield root
    sys.path.remove(str(root))
    sys.modules.pop("tmp_pkg_for_proctor", None)


@needs_bwrap
def test_packages_under_tmp_are_visible_read_only_and_tmp_stays_private(
        make: Callable[..., Interpreter], tmp_package: Path) -> None:
    """Under bubblewrap a sys.path entry under /tmp is bound read-only inside the sandbox's own /tmp."""
    assert str(tmp_package).startswith("/tmp/")
    (tmp_package.parent / "host_secret.txt").write_text("host only")
    py = make(sandbox="bwrap", authorized_imports=["tmp_pkg_for_proctor"])
    r = py.run("import tmp_pkg_for_proctor\n(tmp_pkg_for_proctor.VALUE, tmp_pkg_for_proctor.__version__)")
    assert r.error is None, r.error
    assert list(r.value) == [42, "1.2.3"]
    r = py.run(f"open({str(tmp_package / 'tmp_pkg_for_proctor' / 'evil.py')!r}, 'w').write('x')")
    assert r.error is not None and "Read-only file system" in str(r.error)
    r = py.run(f"open({str(tmp_package.parent / 'host_secret.txt')!r}).read()")
    assert r.error is not None and "FileNotFoundError" in str(r.error)
    r = py.run("open('/tmp/scratch.txt', 'w').write('ok')\nopen('/tmp/scratch.txt').read()")
    assert r.error is None and r.value == "ok"
    assert not Path("/tmp/scratch.txt").exists() or Path("/tmp/scratch.txt").read_text() != "ok"
