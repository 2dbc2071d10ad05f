"""bench/agentdojo_blind/freeze.py: a blind set of AgentDojo policies is hashed once and checked after."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _freeze() -> ModuleType:
    spec = importlib.util.spec_from_file_location("freeze", ROOT / "bench" / "agentdojo_blind" / "freeze.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_set_is_frozen_once_and_any_change_is_caught(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    freeze = _freeze()
    for suite in freeze.SUITES:
        shutil.copy(ROOT / "examples" / "policies" / "agentdojo" / f"{suite}.yaml", tmp_path / f"{suite}.yaml")
    assert freeze.main(["--check", str(tmp_path)]) == 1  # never frozen
    assert freeze.main([str(tmp_path)]) == 0
    manifest = (tmp_path / "FROZEN.sha256").read_text()
    assert manifest.count("policy fingerprint") == 4 and "  banking.yaml" in manifest
    assert freeze.main([str(tmp_path)]) == 1  # a frozen set is never frozen again
    assert freeze.main(["--check", str(tmp_path)]) == 0
    with (tmp_path / "slack.yaml").open("a") as f:
        f.write("# one more line\n")
    assert freeze.main(["--check", str(tmp_path)]) == 1
    assert "slack.yaml: does not match FROZEN.sha256" in capsys.readouterr().err


def test_a_set_that_does_not_load_or_lacks_a_suite_is_not_frozen(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    freeze = _freeze()
    (tmp_path / "banking.yaml").write_text("version: 1\nrules: []\n")
    assert freeze.main([str(tmp_path)]) == 1
    assert "slack.yaml: missing" in capsys.readouterr().err
    for suite in freeze.SUITES:
        (tmp_path / f"{suite}.yaml").write_text("version: 1\nrules: [{name: r}]\n")
    assert freeze.main([str(tmp_path)]) == 1
    assert not (tmp_path / "FROZEN.sha256").exists()
