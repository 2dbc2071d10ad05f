"""The test tiers leave nothing out: `make check` deselects exactly the tier markers, `make test` nothing.

`make check` runs ``-m "not server and not browser and not sandbox and not process"``; the tests it
leaves out are those carrying one of those markers, which `make test` runs (with no ``-m``), so the
two together are the whole suite. These checks keep it so when a tier or a target changes.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import settings
from tiers import CHECK_PROFILE, TIERS, examples

ROOT = Path(__file__).resolve().parents[1]


def _make_variable(name: str) -> str:
    found = re.search(rf"^{name}\s*:?=\s*(.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found, f"Makefile: no {name} variable"
    return found.group(1).strip()


def _recipe(target: str) -> str:
    found = re.search(rf"^{target}:[^\n]*\n((?:\t[^\n]*\n)+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found, f"Makefile: no {target} target"
    return found.group(1)


def test_make_check_deselects_exactly_the_tier_markers() -> None:
    """The fast tier's expression is "not T" for every tier marker T and nothing else."""
    expression = _make_variable("FAST_TIER")
    assert expression == " and ".join(f"not {tier}" for tier in TIERS)
    assert '-m "$(FAST_TIER)"' in _recipe("pytest-fast")
    assert "--hypothesis-profile=check" in _recipe("pytest-fast")


def test_make_test_runs_every_test_with_every_example() -> None:
    """`make test`'s pytest selects nothing away and keeps hypothesis' own profile."""
    recipe = _recipe("pytest")
    assert " -m " not in recipe and " -k " not in recipe and "--hypothesis-profile" not in recipe
    assert "pytest" in _recipe("test").split()
    assert "$(PYTEST)" in recipe and "$(PYTEST)" in _recipe("pytest-fast")


def test_every_tier_marker_is_registered() -> None:
    """A tier marker pytest does not know would be a typo that silently selects nothing."""
    text = (ROOT / "pyproject.toml").read_text()
    markers = text[text.index("markers = ["):]
    registered = set(re.findall(r'^\s*"(\w+): ', markers[:markers.index("]")], re.MULTILINE))
    assert set(TIERS) <= registered


def test_the_check_profile_runs_a_tenth_of_each_tests_examples() -> None:
    """`examples(n)` is n in the full suite and a tenth of it (at least 10, at most n) in `make check`."""
    full = settings.get_profile("default")
    check = settings.get_profile("check")
    assert check.max_examples == CHECK_PROFILE.max_examples
    assert [examples(n, full) for n in (5, 20, 300, 2500)] == [5, 20, 300, 2500]
    assert [examples(n, check) for n in (5, 20, 300, 2500)] == [5, 10, 30, 250]


def test_property_tests_name_their_examples_through_the_tier() -> None:
    """A literal example count would run in full in `make check` too: write ``max_examples=examples(500)``."""
    literal = re.compile(r"max_examples\s*=\s*\d")
    found = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / "tests").rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if literal.search(line)]
    assert found == [], "use max_examples=examples(N) (tests/tiers.py) at " + ", ".join(found)
