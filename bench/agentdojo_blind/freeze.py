"""Freeze a set of AgentDojo policies written blind: hash each one, so the attacks run on exactly what was written.

    .venv/bin/python bench/agentdojo_blind/freeze.py [DIR]           # writes DIR/FROZEN.sha256
    .venv/bin/python bench/agentdojo_blind/freeze.py --check [DIR]   # exit 1 unless every policy matches

DIR (default: this directory) must hold one policy per AgentDojo suite (banking.yaml, slack.yaml, travel.yaml,
workspace.yaml), each of which must load (`Policy.from_yaml`). FROZEN.sha256 is in `sha256sum` format (so
`sha256sum -c FROZEN.sha256` checks it too), and records each policy's proctor fingerprint as a comment.
bench/agentdojo.py refuses to run a directory holding FROZEN.sha256 whose policies do not match it.
Freezing twice is refused: a frozen set is never edited (write a new directory instead).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from proctor.errors import PolicyError
from proctor.policy import Policy

SUITES = ("banking", "slack", "travel", "workspace")
MANIFEST = "FROZEN.sha256"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def freeze(directory: Path) -> int:
    manifest = directory / MANIFEST
    if manifest.exists():
        print(f"{manifest}: already frozen; a frozen set is never edited (write a new directory)", file=sys.stderr)
        return 1
    lines = ["# AgentDojo policies written from docs, tool descriptions and user tasks only "
             "(bench/agentdojo_blind/README.md)"]
    for suite in SUITES:
        path = directory / f"{suite}.yaml"
        if not path.exists():
            print(f"{path}: missing: a set has one policy per suite ({', '.join(SUITES)})", file=sys.stderr)
            return 1
        try:
            policy = Policy.from_yaml(path)
        except PolicyError as exc:
            print(exc, file=sys.stderr)
            return 1
        lines.append(f"# {path.name}: proctor policy fingerprint {policy.sha256}")
        lines.append(f"{_sha256(path)}  {path.name}")
    manifest.write_text("\n".join(lines) + "\n")
    print(manifest.read_text(), end="")
    return 0


def check(directory: Path) -> int:
    manifest = directory / MANIFEST
    if not manifest.exists():
        print(f"{manifest}: missing: this set was never frozen", file=sys.stderr)
        return 1
    listed = {}
    for line in manifest.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            digest, name = line.split(maxsplit=1)
            listed[name.strip()] = digest
    bad = [name for name, digest in listed.items()
           if not (directory / name).exists() or _sha256(directory / name) != digest]
    missing = [f"{s}.yaml" for s in SUITES if f"{s}.yaml" not in listed]
    for name in bad:
        print(f"{directory / name}: does not match {MANIFEST}", file=sys.stderr)
    for name in missing:
        print(f"{directory / name}: not in {MANIFEST}", file=sys.stderr)
    if bad or missing:
        return 1
    print(f"{directory}: every policy matches {MANIFEST}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="check the manifest instead of writing it")
    parser.add_argument("directory", nargs="?", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args(argv)
    return check(args.directory) if args.check else freeze(args.directory)


if __name__ == "__main__":
    sys.exit(main())
