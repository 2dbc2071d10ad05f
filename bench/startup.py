"""Start-up (issue #18.5): whole-process wall time, median of runs, side by side with a bare Python.

Subjects: ``python -c pass`` (the floor), ``python -c 'import proctor'``, ``proctor --help`` and
``proctor policy check`` of a small policy (compiling its CEL), each run `--runs` times in
rotation so the machine's drift touches them alike; then the largest imports of each, from
``python -X importtime``. Also the policy build time at 1,000 and 10,000 rules (#18.6).

Run: .venv/bin/python bench/startup.py [--runs 15]
Targets: import proctor <= 120 ms, proctor --help <= 150 ms, policy check <= 250 ms; build linear.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def _proctor() -> list[str]:
    return [sys.executable, "-c", "import sys; from proctor.cli import main; sys.exit(main())"]


def subjects(policy: Path) -> dict[str, list[str]]:
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "import proctor": [sys.executable, "-c", "import proctor"],
        "proctor --help": [*_proctor(), "--help"],
        "proctor policy check": [*_proctor(), "policy", "check", str(policy)],
    }


#: The subjects run as an installed proctor does: with its bytecode cached (pip compiles a wheel's
#: modules at install). PYTHONDONTWRITEBYTECODE, set in some shells and CI images, would make every
#: run compile proctor's sources again (about a quarter of `policy check`), so it is dropped here.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(cmd: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    return (time.perf_counter() - began) * 1000


def top_imports(cmd: list[str], n: int = 5) -> str:
    out = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], capture_output=True, text=True, env=ENV).stderr
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "small.yaml"
        policy.write_text(SMALL)
        cmds = subjects(policy)
        for cmd in cmds.values():
            timed(cmd)  # warm the page cache and .pyc files
        times: dict[str, list[float]] = {name: [] for name in cmds}
        load = os.getloadavg()[0]
        for _ in range(opts.runs):
            for name, cmd in cmds.items():
                times[name].append(timed(cmd))
        print(f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}; median of {opts.runs} runs, ms")
        floor = statistics.median(times["python -c pass"])
        targets = {"import proctor": 120, "proctor --help": 150, "proctor policy check": 250}
        for name, values in times.items():
            med = statistics.median(values)
            target = f"target <= {targets[name]} ms" if name in targets else "the floor"
            print(f"  {name:<22} {med:7.1f}  (min {min(values):6.1f}; {med / floor:4.1f}x the floor; {target})")
        print("largest imports (cumulative ms, -X importtime, one run):")
        for name in ("import proctor", "proctor --help", "proctor policy check"):
            print(f"  {name:<22} {top_imports(cmds[name])}")
    small, big = min(build_seconds(1000) for _ in range(2)), build_seconds(10_000)
    print(f"policy build: 1,000 rules {small:.2f} s, 10,000 rules {big:.2f} s: {big / small:.1f}x for 10x the rules "
          "(linear: ~10x)")


if __name__ == "__main__":
    main()
