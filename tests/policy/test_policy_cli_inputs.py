"""Hostile command-line JSON: deep, huge or broken input is a located error with exit 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proctor.cli import main
from proctor.errors import ConfigurationError
from proctor.jsoninput import MAX_JSON_INPUT_DEPTH, loads_bounded, shape_problem


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nrules:\n  - {name: any, match: {tool: t}, when: 'size(args) >= 0', decision: allow}\n")
    return path


def _deep(n: int, opener: str = "[", closer: str = "]") -> str:
    return opener * n + closer * n


@pytest.mark.process
def test_explain_with_50000_deep_args_exits_2_with_a_located_error(policy: Path) -> None:
    """The issue's input, run as the command: exit 2, one located line on stderr, no traceback."""
    deep = '{"a": ' + _deep(50_000) + "}"
    proc = subprocess.run([sys.executable, "-m", "proctor.cli", "policy", "explain", str(policy), "--tool", "t",
                           "--args", deep], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr
    assert proc.stderr.strip() == (f"proctor policy explain: --args:1:{7 + MAX_JSON_INPUT_DEPTH - 1}: "
                                   f"JSON nested deeper than {MAX_JSON_INPUT_DEPTH} levels; flatten it")


@pytest.mark.parametrize("option", ["--args", "--history", "--run"])
@pytest.mark.parametrize("opener,closer", [("[", "]"), ('{"k":', "}")])
def test_every_json_option_is_bounded(policy: Path, option: str, opener: str, closer: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Deep arrays or objects in any JSON option are refused with exit 2 and the option named."""
    value = _deep(100_000, opener, closer)
    if option != "--history":
        value = '{"x": ' + value + "}"
    assert main(["policy", "explain", str(policy), "--tool", "t", option, value]) == 2
    err = capsys.readouterr().err
    assert f"{option}:1:" in err and "nested deeper" in err


def test_brackets_inside_strings_do_not_count(policy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A string full of brackets (and escaped quotes) is ordinary data, decided as usual."""
    value = '{"q": "' + "[" * 10_000 + '\\"{{{", "n": [[1]]}'
    assert main(["policy", "explain", str(policy), "--tool", "t", "--args", value, "--json"]) == 0
    assert '"outcome": "allow"' in capsys.readouterr().out


def test_depth_at_the_limit_is_accepted(policy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Exactly the limit of nesting (the object itself counted) is decided; one more level is refused."""
    ok = '{"a": ' + _deep(MAX_JSON_INPUT_DEPTH - 1) + "}"
    assert main(["policy", "explain", str(policy), "--tool", "t", "--args", ok, "--json"]) == 0
    too_deep = '{"a": ' + _deep(MAX_JSON_INPUT_DEPTH) + "}"
    assert main(["policy", "explain", str(policy), "--tool", "t", "--args", too_deep]) == 2
    capsys.readouterr()


def test_broken_json_is_located(policy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Invalid JSON names the option, line and column."""
    assert main(["policy", "explain", str(policy), "--tool", "t", "--args", '{"a":\n  tru}']) == 2
    assert "--args:2:3: not valid JSON" in capsys.readouterr().err


def test_loads_bounded_refuses_size_depth_and_garbage() -> None:
    """The shared reader: size first, then depth, then syntax; all ConfigurationError (a ValueError)."""
    with pytest.raises(ConfigurationError, match=r"^x:1:1: JSON input over 10 bytes"):
        loads_bounded('"' + "a" * 20 + '"', "x", max_bytes=10)
    with pytest.raises(ValueError, match=r"^x:3:2: JSON nested deeper than 2 levels"):
        loads_bounded("[\n[\n [1]]]", "x", max_depth=2)
    assert loads_bounded('[["]]]]"]]', max_depth=2) == [["]]]]"]]
    assert shape_problem('"\\\\"' + "[" * 10, max_depth=5) is not None  # an escaped backslash ends the string
    assert shape_problem('"unterminated [[[[[[', max_depth=2) is None  # json.loads reports it instead
    with pytest.raises(ConfigurationError, match="not valid JSON"):
        loads_bounded('"unterminated [[[[[[', max_depth=2)


def test_run_label_with_deep_json_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """`proctor run --label k=<deep JSON>` exits 2 through argparse, no RecursionError."""
    with pytest.raises(SystemExit) as caught:
        main(["run", "task", "--tools", "x:y", "--policy", "p.yaml", "--model", "m", "--label", "k=" + _deep(50_000)])
    assert caught.value.code == 2
    assert "nested deeper" in capsys.readouterr().err
