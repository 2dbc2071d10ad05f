"""What a blind policy author may read about AgentDojo: each suite's tools (name, description, parameters) and its
user tasks' prompts — never an injection task, an attack text, a ground truth or the environment's data.

    .venv-agentdojo/bin/python bench/agentdojo_blind/materials.py OUT_DIR     # writes OUT_DIR/SUITE.md

Give OUT_DIR, docs/policy.md and the protocol (bench/agentdojo_blind/README.md) to the author, and nothing else.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
try:
    from agentdojo.functions_runtime import FunctionsRuntime
    from agentdojo.task_suite.load_suites import get_suites
except ImportError:  # pragma: no cover - the message is the point
    sys.exit("materials.py needs agentdojo: `make bench-agentdojo` builds .venv-agentdojo")

BENCHMARK_VERSION = "v1.2.2"


def _type_name(annotation: object) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("agentdojo.default_suites.v1.tools.", "").replace("typing.", "")


def _result_schema(annotation: object) -> str:
    """The JSON Schema of a tool's result type (its shape, for `sources.fields` paths; no data)."""
    import json

    import pydantic

    try:
        return json.dumps(pydantic.TypeAdapter(annotation).json_schema(), indent=1, sort_keys=True)
    except Exception:  # a type pydantic cannot describe: its name says it
        return ""


def suite_text(name: str, suite: object) -> str:
    runtime = FunctionsRuntime(suite.tools)  # type: ignore[attr-defined]
    lines = [f"# AgentDojo {BENCHMARK_VERSION}: the {name} suite", "", "## Tools", ""]
    for fname, function in runtime.functions.items():
        lines.append(f"### `{fname}`")
        lines.append("")
        lines.append((function.description or "").strip())
        lines.append("")
        for pname, field in function.parameters.model_fields.items():
            required = "required" if field.is_required() else f"default {field.default!r}"
            lines.append(f"- `{pname}` ({getattr(field.annotation, '__name__', field.annotation)}, {required}): "
                         f"{field.description or ''}")
        lines.append("")
        lines.append(f"Returns: `{_type_name(function.return_type)}`")
        schema = _result_schema(function.return_type)
        if schema:
            lines += ["", "```json", schema, "```"]
        lines.append("")
    lines += ["## User tasks (prompts only)", ""]
    for task_id, task in suite.user_tasks.items():  # type: ignore[attr-defined]
        lines.append(f"- **{task_id}**: {task.PROMPT.strip()}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    for name, suite in get_suites(BENCHMARK_VERSION).items():
        (out / f"{name}.md").write_text(suite_text(name, suite))
        print(out / f"{name}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
