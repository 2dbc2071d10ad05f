"""Ctrl-C and SIGTERM during a tool call, an approval wait and a model call: every ending is in the audit log.

Each case runs a real process — `proctor run`, or a Python program using `CodeAgent` — against
a local OpenAI-compatible server, waits for the moment, signals the process and reads its log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from proctor.agent.replay import run_from_log

from .openai_server import completion

# Agent runs, in this process and as `proctor run`: sandboxed workers (tests/conftest.py, tiers).
pytestmark = pytest.mark.sandbox

ROOT = Path(__file__).resolve().parents[2]
POLICY = """\
version: 1
default: deny
rules:
  - {name: reads, match: {tool: lookup}, decision: allow}
  - {name: internal, match: {tool: wire}, when: "!args.to.startsWith('ext')", decision: allow}
  - {name: external, match: {tool: wire}, when: "args.to.startsWith('ext')", decision: require_approval}
approval: {timeout: 10m}
"""
PROGRAMS = {
    "tool": 'lookup("a")\nwire("int-1")\nfinal_answer("done")',
    "approval": 'lookup("a")\nwire("ext-1")\nfinal_answer("done")',
    "model": 'print(lookup("a"))',
}
SCRIPT = """\
import os, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from interrupt_tools import lookup, wire
from proctor import CallbackApprover, CodeAgent, ScriptedModel

def hang(what):
    def wait(*args):
        Path(os.environ["PROCTOR_TEST_MARKER"]).write_text(what)
        time.sleep(600)
    return wait

model = ScriptedModel([{reply!r}, hang("model")])
with CodeAgent([lookup, wire], model, {policy!r}, approver=CallbackApprover(hang("approval")), audit={audit!r},
               max_steps=3, sandbox="process") as agent:
    print(agent.run("move the money").status)
"""


@dataclass
class Server:
    """Serves one program per model call; hangs the call after the programs run out. Also a webhook that hangs."""

    replies: list[str]
    requests: list[str] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    port: int = 0


@contextmanager
def serve(programs: list[str]) -> Iterator[Server]:
    server_state = Server(list(programs))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            server_state.requests.append(self.path)
            if self.path.startswith("/v1/chat") and server_state.replies:
                program = server_state.replies.pop(0)
                data = json.dumps(completion(f"Thought: go.\n```python\n{program}\n```")).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            server_state.release.wait(60)  # a model or an approver that never answers

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    server_state.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server_state
    finally:
        server_state.release.set()
        httpd.shutdown()
        httpd.server_close()


def _wait_for(check: Any, what: str, proc: subprocess.Popen[str], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the process ended before {what}: {proc.returncode}\n{out}\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def _records(audit: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in audit.read_bytes().splitlines()]


def _start(kind: str, moment: str, tmp_path: Path, server: Server) -> tuple[subprocess.Popen[str], Path, Path]:
    audit, marker = tmp_path / "audit.jsonl", tmp_path / "marker"
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    base = f"http://127.0.0.1:{server.port}/v1"
    env = {**os.environ, "OPENAI_API_KEY": "", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "PROCTOR_TEST_MARKER": str(marker), "PROCTOR_WEBHOOK_SECRET": "s3cret"}
    if kind == "cli":
        command = [sys.executable, "-m", "proctor.cli", "run", "move the money", "--tools",
                   "tests.agent.interrupt_tools", "--policy", str(policy), "--model", "openai/gpt-4o-mini",
                   "--model-arg", f"api_base={base}", "--model-arg", "api_key=test", "--audit", str(audit),
                   "--approver", f"webhook:http://127.0.0.1:{server.port}/approve", "--sandbox", "process",
                   "--max-steps", "3"]
    else:
        script = tmp_path / "program.py"
        reply = f"Thought: go.\n```python\n{PROGRAMS[moment]}\n```"
        script.write_text(SCRIPT.format(tests=str(ROOT / "tests" / "agent"), reply=reply, policy=str(policy),
                                        audit=str(audit)))
        command = [sys.executable, str(script)]
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, audit, marker


# `proctor run` imports litellm, which takes half a minute on a loaded machine: the command is
# signalled once per moment (both signals covered); the Python program at every moment with both.
_BOTH = (signal.SIGINT, signal.SIGTERM)
CASES = [("cli", "tool", signal.SIGTERM), ("cli", "approval", signal.SIGINT), ("cli", "model", signal.SIGTERM)] + [
    ("program", moment, signum) for moment in ("tool", "approval", "model") for signum in _BOTH]


@pytest.mark.parametrize(("kind", "moment", "signum"), CASES,
                         ids=[f"{k}-{m}-{signal.Signals(s).name}" for k, m, s in CASES])
def test_an_interrupted_run_records_every_ending(kind: str, moment: str, signum: int, tmp_path: Path) -> None:
    """run_finished says interrupted; each intent has an outcome; a pending approval is cancelled; steps list calls."""
    programs = [PROGRAMS[moment]]
    with serve(programs) as server:
        proc, audit, marker = _start(kind, moment, tmp_path, server)
        if moment == "model" and kind == "cli":
            _wait_for(lambda: len([r for r in server.requests if r.startswith("/v1/chat")]) >= 2,
                      "the second model call", proc)
        else:
            _wait_for(lambda: marker.exists() or "/approve" in server.requests, f"the {moment}", proc)
        time.sleep(0.2)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    name = signal.Signals(signum).name
    if kind == "cli":
        assert proc.returncode == 128 + signum, err
        assert "worker_lost" not in out + err and "Traceback" not in err
    else:
        assert proc.returncode != 0
    records = _records(audit)
    finished = [r for r in records if r["kind"] == "run_finished"]
    assert len(finished) == 1 and finished[0]["status"] == "interrupted", records
    assert name in finished[0]["error"]
    intents = {r["call_id"]: r["tool"] for r in records if r["kind"] == "call_intent"}
    outcomes = {r["call_id"]: r["status"] for r in records if r["kind"] == "call_outcome"}
    assert set(intents) == set(outcomes)
    by_tool = {intents[c]: outcomes[c] for c in intents}
    steps = [r for r in records if r["kind"] == "step"]
    assert steps and steps[0]["call_ids"] == list(intents)  # the step lists the calls it made, in order
    if moment == "tool":
        assert by_tool == {"lookup": "ok", "wire": "unknown"}
        assert name in steps[0]["error"]
    elif moment == "approval":
        assert by_tool == {"lookup": "ok", "wire": "cancelled"}
        resolved = [r for r in records if r["kind"] == "approval_resolved"]
        assert [r["verdict"] for r in resolved] == ["cancelled"]
    else:
        assert by_tool == {"lookup": "ok"}
        assert len(steps) == 2 and steps[1]["call_ids"] == [] and name in steps[1]["error"]
    assert records[-1]["kind"] == "checkpoint"  # the log was closed and sealed on the way out
    replayed = run_from_log(audit, finished[0]["run_id"])  # what `proctor audit show --run` prints
    assert replayed.ended == "finished" and replayed.result.status == "interrupted"
    assert any("interrupted" in note and name in note for note in replayed.notes[len(replayed.result.steps)])
    assert [c.tool for c in replayed.result.tool_calls] == list(intents.values())

