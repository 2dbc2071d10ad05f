"""Red team: the quiet (no-op) span path must not hide calls from a tracer installed after the gate was made."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

# Every test here starts a process (see tests/conftest.py): `make test` runs them, `make check` does not.
pytestmark = pytest.mark.process

# In a child: the global tracer provider can be set once per process.
_LATE = textwrap.dedent("""\
    import json
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from proctor import Gate, Policy, tool

    @tool(side_effect="read")
    def look(x: int) -> int:
        '''Look.

        Args:
            x: X.
        '''
        return x

    gate = Gate(Policy.from_dict({"version": 1, "default": "allow"}), tools=[look])
    ctx = gate.start_run()
    gate.call("look", {"x": 1}, context=ctx)  # nothing receives spans yet: the quiet path
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    gate.call("look", {"x": 2}, context=ctx)  # the same gate, now traced
    gate.finish_run(ctx)
    print(json.dumps([s.name for s in exporter.get_finished_spans()]))
""")


def test_a_gate_made_before_the_app_installs_its_tracer_provider_traces_later_calls() -> None:
    """Calls after the provider is set get their execute_tool span; the one before it, made quietly, does not."""
    proc = subprocess.run([sys.executable, "-c", _LATE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    spans = json.loads(proc.stdout.strip().splitlines()[-1])
    assert spans == ["execute_tool look"]
