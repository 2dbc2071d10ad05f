"""The harness routing smolagents' executor tests through proctor works (the figure: bench/smolagents_executor.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Every test here starts a process (see tests/conftest.py): `make test` runs them, `make check` does not.
pytestmark = pytest.mark.process

HARNESS = Path(__file__).resolve().parents[2] / "bench" / "smolagents_tests"
SAMPLE = ("test_evaluate_if or test_evaluate_for or test_final_answer_accepts_kwarg_answer "
          "or test_print_output or test_evaluate_assign_error")


def test_a_sample_of_smolagents_executor_tests_passes_through_proctor(tmp_path: Path) -> None:
    """A sample of smolagents' own tests runs its programs in proctor's worker and passes as the bench counts."""
    out = tmp_path / "results.json"
    env = {**os.environ, "PYTHONPATH": str(HARNESS), "PROCTOR_ROUTE_RESULTS": str(out)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "proctor_route",
                           "-o", "addopts=", "-o", "filterwarnings=", "-o", "timeout=60", "--rootdir", str(HARNESS),
                           "-c", os.devnull, "-k", SAMPLE, str(HARNESS / "test_local_python_executor.py")],
                          cwd=HARNESS, env=env, capture_output=True, text=True, timeout=300)
    results = json.loads(out.read_text())
    assert len(results) >= 5, proc.stdout + proc.stderr
    assert all(r["routed"] for r in results.values()), results
    # As the figure counts them: passed, or failed only on an error message's wording / the operation counter.
    assert all(r["outcome"] == "passed" or r.get("wording") for r in results.values()), proc.stdout
    assert sum(r["outcome"] == "passed" for r in results.values()) >= 2, proc.stdout
