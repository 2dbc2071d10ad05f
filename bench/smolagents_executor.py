"""smolagents' own executor tests (tests/test_local_python_executor.py of smolagents 1.26.0), routed
through proctor's Interpreter: how many pass. The figure docs/smolagents.md reports.

    .venv/bin/python bench/smolagents_executor.py              # routed through proctor (bubblewrap when usable)
    .venv/bin/python bench/smolagents_executor.py --native     # the same tests against smolagents itself
    .venv/bin/python bench/smolagents_executor.py --failures   # and every failing test with its first error line
    PYTHONPATH=/path/to/older/checkout .venv/bin/python bench/smolagents_executor.py   # an older proctor

The tests are vendored unchanged in bench/smolagents_tests/ (Apache-2.0, HuggingFace); the
routing plugin is bench/smolagents_tests/proctor_route.py. "Routed" tests are those that ran a
program through `evaluate_python_code` or `LocalPythonExecutor`; the others test smolagents'
own AST evaluator's internals and run against smolagents as they are. A failure counts as
"wording" when an expected error was raised and only its message's text differed (or a state
dict differed only by smolagents' internal operation counter).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent / "smolagents_tests"


def run(native: bool) -> dict[str, dict[str, object]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "PYTHONPATH": path, "PROCTOR_ROUTE_RESULTS": str(out)}
        if native:
            env["PROCTOR_ROUTE_NATIVE"] = "1"
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "proctor_route",
                        "-o", "addopts=", "-o", "filterwarnings=", "-o", "timeout=60", "--rootdir", str(HERE),
                        "-c", os.devnull, str(HERE / "test_local_python_executor.py")],
                       cwd=HERE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        return json.loads(out.read_text())  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--native", action="store_true", help="run against smolagents' own executor")
    parser.add_argument("--failures", action="store_true", help="list every failing routed test")
    args = parser.parse_args()
    results = run(args.native)
    routed = {k: v for k, v in results.items() if v.get("routed")}
    counts = Counter(str(v.get("outcome")) for v in routed.values())
    wording = sum(1 for v in routed.values() if v.get("outcome") == "failed" and v.get("wording"))
    total = len(routed)
    passed = counts["passed"]
    label = "smolagents itself" if args.native else "routed through proctor"
    print(f"smolagents 1.26.0 executor tests, {label}: {len(results)} collected, {total} run a program")
    print(f"  passed                      {passed:4d} / {total}")
    print(f"  failed on wording only      {wording:4d}")
    print(f"  passed, wording forgiven    {passed + wording:4d} / {total}  ({(passed + wording) / max(total, 1):.0%})")
    print(f"  failed otherwise            {counts['failed'] - wording:4d}")
    print(f"  skipped                     {counts['skipped']:4d}")
    if args.failures:
        for name, v in sorted(routed.items()):
            if v.get("outcome") == "failed" and not v.get("wording"):
                print(f"{name.split('::', 1)[1]}: {v.get('reason', '')}")


if __name__ == "__main__":
    main()
