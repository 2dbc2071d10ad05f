"""`proctor run` from a directory holding planted modules: only the named tools module comes from there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from proctor.agent.loading import ToolLoadError, load_tools
from proctor.importpath import cwd_not_importable, import_from_cwd, names_cwd

from .openai_server import completion, serve

# `proctor run`/`demo` as processes: each starts an agent's sandboxed worker (tests/conftest.py, tiers).
pytestmark = pytest.mark.sandbox

# Modules proctor (or the libraries it uses) import lazily, after the command has started.
PLANTED = ("litellm", "rich", "yaml", "orjson", "structlog", "httpx", "pydantic", "opentelemetry", "celpy",
           "cryptography", "openai", "tiktoken", "jinja2")
TOOLS = '''from proctor import tool


@tool(side_effect="read")
def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: The key.
    """
    return "value-" + key
'''
POLICY = "version: 1\nrules:\n  - {name: reads, match: {side_effect: read}, decision: allow}\n"
PROGRAM = 'Thought: look.\n```python\nfinal_answer(lookup("k"))\n```'


def _plant(where: Path, marker: Path) -> None:
    """A module for every name in PLANTED that records its import and fails it."""
    body = (f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
            "raise ImportError('planted module ' + __name__ + ' was imported')\n")
    for i, name in enumerate(PLANTED):
        if i % 2:  # half as packages, half as plain modules
            (where / name).mkdir()
            (where / name / "__init__.py").write_text(body)
        else:
            (where / f"{name}.py").write_text(body)
    (where / "mytools.py").write_text(TOOLS)
    (where / "policy.yaml").write_text(POLICY)


@pytest.mark.parametrize("launcher", ["script", "module"])
def test_planted_modules_in_the_cwd_are_never_imported(tmp_path: Path, launcher: str) -> None:
    """A run from a directory full of fake litellm/rich/yaml/… uses the installed ones; the tools come from there."""
    marker = tmp_path / "imported.txt"
    work = tmp_path / "work"
    work.mkdir()
    _plant(work, marker)
    script = Path(sys.executable).with_name("proctor")
    head = [str(script)] if launcher == "script" else [sys.executable, "-m", "proctor.cli"]
    env = {**os.environ, "OPENAI_API_KEY": "", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    env.pop("PYTHONPATH", None)
    with serve([completion(PROGRAM)]) as fake:
        proc = subprocess.run(
            [*head, "run", "look k up", "--tools", "mytools", "--policy", "policy.yaml", "--json",
             "--audit", str(tmp_path / "audit.jsonl"), "--model", "openai/gpt-4o-mini",
             "--model-arg", f"api_base={fake.base}", "--model-arg", "api_key=test"],
            cwd=work, env=env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert not marker.exists(), f"imported from the cwd: {marker.read_text()}"
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["answer"] == "value-k"


def test_import_from_cwd_leaves_sys_path_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The named module is found in the cwd without the cwd ever being added to sys.path."""
    (tmp_path / "cwdtools_a.py").write_text(TOOLS)
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    try:
        tools = load_tools(["cwdtools_a:lookup"])
        assert [t.name for t in tools] == ["lookup"]
        assert sys.path == before and not any(names_cwd(p) for p in sys.path)
    finally:
        sys.modules.pop("cwdtools_a", None)


def test_a_sibling_import_is_refused_with_a_way_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tools module importing a file beside it gets a one-line ToolLoadError saying to make a package."""
    (tmp_path / "cwdtools_b.py").write_text("import cwdhelper_b\n" + TOOLS)
    (tmp_path / "cwdhelper_b.py").write_text("X = 1\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ToolLoadError, match="make them one package"):
        load_tools(["cwdtools_b"])
    assert "cwdtools_b" not in sys.modules and "cwdhelper_b" not in sys.modules
    # As a package it works: its own imports resolve inside the package.
    pkg = tmp_path / "cwdpkg_b"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("X = 1\n")
    (pkg / "tools.py").write_text("from cwdpkg_b import helper\n" + TOOLS)
    try:
        assert [t.name for t in load_tools(["cwdpkg_b.tools"])] == ["lookup"]
    finally:
        for name in ("cwdpkg_b", "cwdpkg_b.tools", "cwdpkg_b.helper"):
            sys.modules.pop(name, None)


def test_cwd_not_importable_removes_and_restores_every_alias(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """'', '.', the cwd and a symlink to it are all taken off sys.path for the block and put back after."""
    link = tmp_path / "link"
    link.symlink_to(tmp_path, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    entries = ["", ".", str(tmp_path), str(link)]
    monkeypatch.setattr(sys, "path", [*entries, *sys.path])
    before = list(sys.path)
    with cwd_not_importable():
        assert not any(p in entries for p in sys.path)
        (tmp_path / "shadowme_c.py").write_text("raise RuntimeError('shadowed')\n")
        with pytest.raises(ModuleNotFoundError):
            __import__("shadowme_c")
    assert sys.path == before


def test_import_from_cwd_prefers_an_already_imported_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted file named like a module proctor already holds does not replace it."""
    (tmp_path / "json.py").write_text("raise RuntimeError('planted')\n")
    monkeypatch.chdir(tmp_path)
    assert import_from_cwd("json") is sys.modules["json"]


def test_a_namespace_package_in_the_cwd_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory without __init__.py (as examples/ in a checkout) is found like a package."""
    (tmp_path / "cwdns_d").mkdir()
    (tmp_path / "cwdns_d" / "tools.py").write_text(TOOLS)
    monkeypatch.chdir(tmp_path)
    try:
        assert [t.name for t in load_tools(["cwdns_d.tools:lookup"])] == ["lookup"]
    finally:
        sys.modules.pop("cwdns_d", None)
        sys.modules.pop("cwdns_d.tools", None)
