"""docs/policy.md documents every key the policy schema accepts, and no key it does not (issue 34.3).

The schema is walked as `proctor policy schema` prints it (the pydantic models' JSON Schema), and
compared with the reference's "Every key" table and its "Top-level keys" table: the same keys, and
every choice a key offers named in its row. A key added to the models without a row fails here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from proctor.policy.schema import policy_json_schema

DOC = Path(__file__).resolve().parents[2] / "docs" / "policy.md"


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    return defs[ref.rsplit("/", 1)[1]] if isinstance(ref, str) else node


def _choices(node: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    """The fixed words a key accepts: its enum, its anyOf branches' enums, and `label:KEY` for a pattern branch."""
    out = [str(v) for v in node.get("enum", [])]
    for branch in node.get("anyOf", []):
        branch = _resolve(branch, defs)
        out += [str(v) for v in branch.get("enum", [])]
        if str(branch.get("pattern", "")).startswith("^label:"):
            out.append("label:KEY")
    return out


def schema_keys() -> dict[str, list[str]]:
    """Every key path of the policy schema (`tools.NAME.cost`, `budgets[].limit.calls`) and its choices."""
    schema = policy_json_schema()
    defs = schema["$defs"]
    found: dict[str, list[str]] = {}

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, sub in _resolve(node, defs).get("properties", {}).items():
            sub = _resolve(sub, defs)
            path = f"{prefix}{key}"
            found[path] = _choices(sub, defs)
            if "properties" in sub:
                walk(sub, path + ".")
            items = sub.get("items")
            if sub.get("type") == "array" and isinstance(items, dict) and "properties" in _resolve(items, defs):
                walk(items, path + "[].")
            extra = sub.get("additionalProperties")
            if isinstance(extra, dict) and "properties" in _resolve(extra, defs):
                walk(extra, path + ".NAME.")
            for value in sub.get("patternProperties", {}).values():  # `sources.fields`: path -> labels or choices
                for branch in [value, *value.get("oneOf", []), *value.get("anyOf", [])]:
                    items = branch.get("items")
                    if branch.get("type") == "array" and isinstance(items, dict) and "properties" in _resolve(
                            items, defs):
                        walk(items, path + ".PATH[].")

    walk(schema, "")
    return found


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def _table(section: str) -> dict[str, str]:
    """First-column key (in backticks) -> the rest of the row, for every row of the section's tables."""
    rows = {}
    for line in section.splitlines():
        found = re.match(r"^\| `([^`]+)` \|(.*)\|$", line)
        if found:
            rows[found.group(1)] = found.group(2)
    return rows


def test_every_key_table_matches_the_schema() -> None:
    """The reference lists exactly the schema's keys."""
    documented = _table(_section(DOC.read_text(encoding="utf-8"), "Every key"))
    keys = schema_keys()
    assert sorted(set(keys) - set(documented)) == [], "keys the schema accepts that docs/policy.md does not list"
    assert sorted(set(documented) - set(keys)) == [], "keys docs/policy.md lists that the schema does not accept"


def test_every_choice_a_key_offers_is_named_in_its_row() -> None:
    """`per:` names run, step, principal, label:KEY and global; `sandbox:` auto and required; and so on."""
    documented = _table(_section(DOC.read_text(encoding="utf-8"), "Every key"))
    missing = {key: [c for c in choices if f"`{c}`" not in documented[key]]
               for key, choices in schema_keys().items() if choices}
    assert {k: v for k, v in missing.items() if v} == {}
    assert "`label:KEY`" in documented["budgets[].per"] and "`global`" in documented["budgets[].per"]


def test_top_level_table_has_every_top_level_key() -> None:
    """The "Top-level keys" table has a row for each top-level key of the schema, and only those."""
    top = _table(_section(DOC.read_text(encoding="utf-8"), "Top-level keys"))
    assert set(top) == {k for k in schema_keys() if "." not in k and "[" not in k}


@pytest.mark.process
def test_the_walk_reads_what_policy_schema_prints() -> None:
    """The schema walked here is the one `proctor policy schema` gives editors (not a copy of the models)."""
    proc = subprocess.run([sys.executable, "-m", "proctor.cli", "policy", "schema"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json.loads(json.dumps(policy_json_schema()))
    assert {"sandbox", "ledger", "budgets[].per", "budgets[].window"} <= set(schema_keys())
