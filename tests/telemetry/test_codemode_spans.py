"""`proctor mcp serve` exports a span per governed call over OTLP, as `proctor run` does (`--otlp`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from codemode.helpers import serve_args, stdio_session, text, write_config
from otlp_receivers import HttpReceiver

pytestmark = pytest.mark.server


def test_mcp_serve_sends_each_calls_span_to_the_otlp_endpoint(tmp_path: Path) -> None:
    servers, policy, audit = write_config(tmp_path)
    receiver = HttpReceiver()
    try:
        args = serve_args(servers, policy, audit, "--user", "alice", "--otlp", receiver.endpoint,
                          "--otlp-protocol", "http/protobuf")

        async def go() -> str:
            async with stdio_session(args) as s:
                return text(await s.call_tool("run_python", {"code": "[t_add(1, 2), t_add(3, 4)]"}))

        assert "value: [3, 7]" in asyncio.run(go())
        # The session's end stops the server, which flushes its spans on the way out.
        spans = receiver.wait_for(lambda got: sum(s.name == "execute_tool t_add" for s in got) >= 2)
    finally:
        receiver.close()
    calls = [s for s in spans if s.name == "execute_tool t_add"]
    assert len(calls) == 2 and len({s.trace_id for s in calls}) >= 1
    assert all(s.attributes.get("proctor.decision") == "allow" for s in calls), [s.attributes for s in calls]
