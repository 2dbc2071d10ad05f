"""Start-up (issue #18.5): whole-process wall time, median of runs, side by side with a bare Python.

Subjects: ``python -c pass`` (the floor), ``python -c 'import proctor'``, ``proctor --help`` and
``proctor policy check`` of a small policy (compiling its CEL), each run `--runs` times in
rotation so the machine's drift touches them alike; then the largest imports of each, from
``python -X importtime``. Also the policy build time at 1,000 and 10,000 rules (#18.6).

Each subject's CPU time (user + system, from wait4) is shown beside its wall time: on a shared,
loaded machine CPU time moves much less. ``--baseline REV`` runs the same subjects against REV's
``proctor/`` (extracted with git archive, first on PYTHONPATH) in the same rotation, side by side;
``--against DIR`` does the same with another checkout and its own ``.venv`` (its C extensions built);
``--instructions`` also counts each subject's instructions once under callgrind (PYTHONHASHSEED=0),
the figure to decide by when wall times are noise.

Run: .venv/bin/python bench/startup.py [--runs 15] [--baseline REV | --against DIR] [--instructions]
Targets: import proctor <= 120 ms, proctor --help <= 150 ms, policy check <= 250 ms; build linear.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SMALL = """version: 1
tools:
  get_weather: {side_effect: read}
  send_email: {side_effect: external}
rules:
  - name: reads
    match: {side_effect: read}
    decision: allow
  - name: internal-mail
    match: {tool: send_email}
    when: "normalize(args.to).endsWith('@example.com')"
    decision: allow
  - name: no-exfiltration
    match: {side_effect: external}
    when: "history.exists(h, h.tool == 'read_secret')"
    decision: deny
"""


def _proctor(python: str) -> list[str]:
    return [python, "-c", "import sys; from proctor.cli import main; sys.exit(main())"]


def subjects(policy: Path, python: str = sys.executable) -> dict[str, list[str]]:
    return {
        "python -c pass": [python, "-c", "pass"],
        "import proctor": [python, "-c", "import proctor"],
        "proctor --help": [*_proctor(python), "--help"],
        "proctor policy check": [*_proctor(python), "policy", "check", str(policy)],
    }


#: The subjects run as an installed proctor does: with its bytecode cached (pip compiles a wheel's
#: modules at install). PYTHONDONTWRITEBYTECODE, set in some shells and CI images, would make every
#: run compile proctor's sources again (about a quarter of `policy check`), so it is dropped here.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(cmd: list[str], env: dict[str, str] | None = None, cwd: str | None = None) -> tuple[float, float]:
    """(wall ms, CPU ms) of one run of `cmd`."""
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env or ENV, cwd=cwd)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = (time.perf_counter() - began) * 1000
    if status != 0:
        raise SystemExit(f"{cmd} failed (wait status {status})")
    return wall, (usage.ru_utime + usage.ru_stime) * 1000


def instructions(cmd: list[str], env: dict[str, str], cwd: str) -> int:
    """Instructions of one run of `cmd` under callgrind (PYTHONHASHSEED=0: the same run every time)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out", *cmd],
                             capture_output=True, text=True, env={**env, "PYTHONHASHSEED": "0"}, cwd=cwd).stderr
    found = re.search(r"Collected : (\d+)", out)
    if found is None:
        raise SystemExit(f"callgrind gave no count for {cmd}: {out[-300:]}")
    return int(found.group(1))


def baseline_tree(rev: str, into: Path) -> dict[str, str]:
    """Extract `rev`'s proctor/ into `into`; the environment that imports it instead of this checkout's."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "proctor"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return {**ENV, "PYTHONPATH": str(into)}


def top_imports(cmd: list[str], cwd: str, n: int = 5) -> str:
    out = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], capture_output=True, text=True, env=ENV,
                         cwd=cwd).stderr
    rows = []
    for line in out.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, name = (part.strip() for part in line.removeprefix("import time:").split("|"))
            if cumulative.isdigit() and not name.startswith(" "):
                rows.append((int(cumulative), name.strip()))
    top = sorted(rows, reverse=True)[:n]
    return ", ".join(f"{name} {us / 1000:.0f}" for us, name in top)


def build_seconds(rules: int) -> float:
    sys.path.insert(0, str(Path(__file__).parent))
    from policy_decide import build

    import proctor.policy.conditions as conditions

    conditions.compile_expression.cache_clear()  # compile every condition, as a fresh process would
    conditions.compile_condition.cache_clear()
    began = time.perf_counter()
    build(rules)
    return time.perf_counter() - began


def _row(values: list[tuple[float, float]]) -> tuple[float, float, float]:
    walls, cpus = [w for w, _ in values], [c for _, c in values]
    return statistics.median(walls), min(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--baseline", metavar="REV", help="also run REV's proctor/, side by side")
    parser.add_argument("--against", metavar="DIR", help="also run the checkout DIR with DIR/.venv, side by side")
    parser.add_argument("--instructions", action="store_true", help="count instructions once under callgrind")
    parser.add_argument("--no-build", action="store_true", help="skip the policy build figures")
    opts = parser.parse_args()
    targets = {"import proctor": 120, "proctor --help": 150, "proctor policy check": 250}
    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "small.yaml"
        policy.write_text(SMALL)
        cmds = subjects(policy)
        commands: dict[str, dict[str, list[str]]] = {"this tree": cmds}
        # The subjects run from an empty directory: `-c` puts the current directory first on sys.path.
        cwd = Path(tmp) / "cwd"
        cwd.mkdir()
        trees: dict[str, dict[str, str]] = {"this tree": ENV}
        if opts.baseline:
            base = Path(tmp) / "baseline"
            base.mkdir()
            trees = {opts.baseline: baseline_tree(opts.baseline, base), "this tree": ENV}
            commands[opts.baseline] = cmds
        elif opts.against:
            opts.baseline = opts.against  # the same side-by-side report
            trees = {opts.against: ENV, "this tree": ENV}
            commands[opts.against] = subjects(policy, str(Path(opts.against).resolve() / ".venv/bin/python"))
        for tree, env in trees.items():
            for cmd in commands[tree].values():
                timed(cmd, env, str(cwd))  # warm the page cache and .pyc files
        times: dict[tuple[str, str], list[tuple[float, float]]] = {(t, n): [] for t in trees for n in cmds}
        load = os.getloadavg()[0]
        for _ in range(opts.runs):
            for name in cmds:
                for tree, env in trees.items():
                    times[tree, name].append(timed(commands[tree][name], env, str(cwd)))
        print(f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}; median of {opts.runs} runs, ms "
              "(wall median, min; CPU median)")
        for tree in trees:
            floor_wall, _, floor_cpu = _row(times[tree, "python -c pass"])
            print(f" {tree}:")
            for name in cmds:
                wall, low, cpu = _row(times[tree, name])
                target = f"target <= {targets[name]} ms" if name in targets else "the floor"
                print(f"  {name:<22} wall {wall:7.1f} (min {low:6.1f}), CPU {cpu:7.1f}; "
                      f"{wall / floor_wall:4.1f}x / {cpu / floor_cpu:4.1f}x the floor; {target}")
        if opts.baseline:
            print(f" this tree / {opts.baseline} (wall, CPU):")
            for name in cmds:
                (new_wall, _, new_cpu), (old_wall, _, old_cpu) = (_row(times["this tree", name]),
                                                                  _row(times[opts.baseline, name]))
                print(f"  {name:<22} {new_wall / old_wall:5.2f}x  {new_cpu / old_cpu:5.2f}x")
        if opts.instructions:
            if shutil.which("valgrind") is None:
                raise SystemExit("--instructions needs valgrind")
            print("instructions (callgrind, PYTHONHASHSEED=0, one run each), M:")
            for tree, env in trees.items():
                counts = {name: instructions(cmd, env, str(cwd)) / 1e6 for name, cmd in commands[tree].items()}
                floor = counts["python -c pass"]
                print(f" {tree}: " + ", ".join(f"{name} {n:,.1f} ({n / floor:.2f}x)" for name, n in counts.items()))
        print("largest imports (cumulative ms, -X importtime, one run, this tree):")
        for name in ("import proctor", "proctor --help", "proctor policy check"):
            print(f"  {name:<22} {top_imports(cmds[name], str(cwd))}")
    if opts.no_build:
        return
    small, big = min(build_seconds(1000) for _ in range(2)), build_seconds(10_000)
    print(f"policy build: 1,000 rules {small:.2f} s, 10,000 rules {big:.2f} s: {big / small:.1f}x for 10x the rules "
          "(linear: ~10x)")


if __name__ == "__main__":
    main()
