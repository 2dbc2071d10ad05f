"""Hostile YAML against every document proctor reads: alias bombs, depth, size, encoding."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proctor.cli import main
from proctor.errors import PolicyError
from proctor.policy import Policy
from proctor.policy.cases import load_cases
from proctor.policy.yamlsafe import MAX_YAML_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES, check_yaml


def _bomb(levels: int = 9, style: str = "flow") -> str:
    """The issue's ~450-byte policy: nine levels of anchors, each a list of nine aliases of the one before."""
    lines = ["version: 1", 'x0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        if style == "flow":
            lines.append(f"x{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
        else:  # mappings of aliases in block style
            lines.append(f"x{i}: &a{i}")
            lines.extend(f"  k{j}: *a{i - 1}" for j in range(9))
    return "\n".join(lines) + "\n"


def _peak_mib(code: str) -> tuple[int, str]:
    """Run `code` in a fresh interpreter; its own peak RSS in MiB and its stdout."""
    script = code + ("\nfor row in open('/proc/self/status'):\n    if row.startswith('VmHWM:'):\n"
                     "        print('RSS', int(row.split()[1]) // 1024)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "RSS" in proc.stdout, proc.stderr
    return int(proc.stdout.rsplit("RSS", 1)[1]), proc.stdout


@pytest.mark.parametrize("style", ["flow", "block"])
def test_alias_bomb_policy_is_refused_located(style: str) -> None:
    """The nine-level alias bomb is a PolicyError at the alias that crosses the node limit."""
    text = _bomb(style=style)
    assert len(text.encode()) < 2000
    with pytest.raises(PolicyError) as caught:
        Policy.from_string(text, "bomb.yaml")
    (issue,) = caught.value.issues
    assert issue.file == "bomb.yaml" and issue.line > 1 and issue.column > 1
    assert f"more than {MAX_YAML_NODES} nodes" in issue.message and "alias" in issue.message


@pytest.mark.process
def test_policy_check_on_the_bomb_exits_1_with_bounded_memory(tmp_path: Path) -> None:
    """`proctor policy check` prints FILE:LINE:COL and exits 1, its peak memory far from the 2.9 GB of the issue."""
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb())
    rss, out = _peak_mib(f"from proctor.cli import main\nprint('RC', main(['policy', 'check', {str(path)!r}]))\n")
    assert "RC 1" in out and f"{path}:7:14: YAML expands to more than" in out, out
    assert rss < 150, rss


def test_cases_file_bomb_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same bomb as a cases file is refused by `policy test` with a located issue."""
    policy = tmp_path / "p.yaml"
    policy.write_text("version: 1\nrules: []\n")
    cases = tmp_path / "cases.yaml"
    cases.write_text(_bomb().replace("version: 1\n", "- tool: t\n  expect: deny\n  args:\n").replace("\nx", "\n    x"))
    assert main(["policy", "test", str(policy), str(cases)]) == 1
    out = capsys.readouterr().out
    assert f"{cases}:" in out and "YAML expands to more than" in out
    with pytest.raises(PolicyError, match="YAML expands"):
        load_cases(cases.read_text(), str(cases))


def test_long_anchored_scalar_repeated_is_refused() -> None:
    """Few nodes but a 1 MB scalar aliased 40 times is over the expanded-characters limit."""
    text = "version: 1\nbig: &s " + "x" * (1 << 20) + "\nmany: [" + ", ".join(["*s"] * 40) + "]\n"
    with pytest.raises(PolicyError, match="characters of scalars") as caught:
        Policy.from_string(text)
    assert caught.value.issues[0].line == 3


@pytest.mark.parametrize("opener", ["[", "{a: "])
def test_deep_nesting_is_refused_located(opener: str) -> None:
    """50,000 nested flow collections are refused at the first level past the depth limit, not a RecursionError."""
    closer = "]" if opener == "[" else "}"
    text = "version: 1\nx: " + opener * 50_000 + closer * 50_000 + "\n"
    with pytest.raises(PolicyError, match=f"nested deeper than {MAX_YAML_DEPTH}") as caught:
        Policy.from_string(text)
    issue = caught.value.issues[0]
    assert issue.line == 2 and issue.column == 4 + MAX_YAML_DEPTH * len(opener) - len(opener)


def test_deep_block_nesting_is_refused() -> None:
    """Deep block-style mappings are refused too."""
    text = "version: 1\n" + "".join(f"{'  ' * i}k{i}:\n" for i in range(200))
    with pytest.raises(PolicyError, match="nested deeper"):
        Policy.from_string(text)


def test_oversized_file_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    """A policy over the size limit is a located PolicyError; from_string holds the same limit."""
    path = tmp_path / "big.yaml"
    filler = "# " + "x" * 98 + "\n"
    path.write_text("version: 1\n" + filler * (MAX_YAML_BYTES // 100 + 10))
    with pytest.raises(PolicyError, match=f"over the {MAX_YAML_BYTES}-byte limit") as caught:
        Policy.from_yaml(path)
    issue = caught.value.issues[0]
    assert issue.file == str(path) and issue.line > 40_000
    with pytest.raises(PolicyError, match=f"over the {MAX_YAML_BYTES}-byte limit"):
        Policy.from_string(path.read_text())


@pytest.mark.process
def test_huge_sparse_file_costs_little(tmp_path: Path) -> None:
    """A 2 GB (sparse) policy file is refused after reading the limit, in bounded memory."""
    path = tmp_path / "huge.yaml"
    with path.open("wb") as f:
        f.write(b"version: 1\n#")
        f.truncate(2 << 30)
    rss, out = _peak_mib(f"from proctor.cli import main\nprint('RC', main(['policy', 'check', {str(path)!r}]))\n")
    assert "RC 1" in out and "-byte limit" in out and rss < 150, (rss, out)


def test_not_utf8_is_located(tmp_path: Path) -> None:
    """A byte that is not UTF-8 is reported at its line and column."""
    path = tmp_path / "p.yaml"
    path.write_bytes(b"version: 1\nrules:\n  - name: \xff\n")
    with pytest.raises(PolicyError) as caught:
        Policy.from_yaml(path)
    issue = caught.value.issues[0]
    assert (issue.line, issue.column) == (3, 11) and "not UTF-8" in issue.message


def test_ordinary_anchors_still_work() -> None:
    """Anchors and aliases within the limits load as before (shared `match` blocks, say)."""
    text = (
        "version: 1\nrules:\n"
        "  - {name: a, match: &m {tool: [a, b]}, decision: allow}\n"
        "  - {name: b, match: *m, when: 'args.x == 1', decision: deny}\n"
    )
    policy = Policy.from_string(text)
    assert [r.name for r in policy.rules] == ["a", "b"]
    assert check_yaml(_bomb(levels=4), "x") == []  # 9**4 nodes: within the limit


def test_the_limit_is_on_expansion_not_on_text() -> None:
    """A document just under the node limit passes the check; one alias more is refused."""
    per = 1 + 9  # a list of nine scalars
    count = (MAX_YAML_NODES - 3) // per  # root mapping + key + the list of aliases
    text = "a: &a [1,2,3,4,5,6,7,8,9]\nb: [" + ",".join(["*a"] * (count - 2)) + "]\n"
    assert check_yaml(text, "x") == []
    text_over = "a: &a [1,2,3,4,5,6,7,8,9]\nb: [" + ",".join(["*a"] * (count + 2)) + "]\n"
    assert check_yaml(text_over, "x")[0].message.startswith("YAML expands")
