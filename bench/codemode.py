"""Code mode (`proctor mcp serve`) beside direct MCP tool calling, side by side in one run.

(a) **Context bytes** for "read 20 files from the filesystem server, keep those that match, write a
    summary": what reaches the model's context under direct tool calling (every tool definition of
    the server, then each call's arguments and each result) versus code mode through proctor (its
    three tool definitions, the `describe_tool` answers for the three functions used, the program and
    the `run_python` result). Both are measured on the real servers: the bytes are the JSON the
    client receives (definitions) and the text the model reads (arguments, results).
(b) **Cost added to one upstream call**: N calls of the filesystem server's `get_file_info` made
    directly by an MCP client session over stdio, versus the same N calls made by one `run_python`
    program through proctor (each call decided, audited and traced), per call, batches of each
    alternating with both sessions open; and the median single call of each batch. Target <= 1.10x.
(c) ``--layers``: where (b)'s time goes, layer by layer (same server, alternating batches): a direct MCP
    client session on its own loop; in this process, `MCPToolset.call` (the session, run by the calling
    thread), `gate.call` (decision, budgets, audit intent and outcome, span) and a program's calls through
    the sandboxed `Interpreter` (the worker channel); then (b)'s governed call through the `proctor mcp
    serve` process, in the same alternation. Beside each wall time, the CPU time per call of every process
    involved (from /proc, on Linux): on a shared machine wall time is mostly waiting for a core, and the
    chain of a call is serial, so CPU time says what each layer costs where load does not.

Needs npx (`@modelcontextprotocol/server-filesystem` is fetched on first use). Run:
`.venv/bin/python bench/codemode.py [--calls N] [--rounds R] [--layers]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

FS = "@modelcontextprotocol/server-filesystem"
POLICY = """\
version: 1
default: deny
tools:
  files_list_directory: {side_effect: read}
  files_read_text_file: {side_effect: read}
  files_get_file_info: {side_effect: read}
  files_write_file: {side_effect: write}
rules:
  - name: reads
    match: {side_effect: read}
    decision: allow
  - name: summary
    match: {tool: files_write_file}
    decision: allow
"""
PROGRAM = """\
names = sorted(l.split('] ', 1)[1] for l in files_list_directory(path=DATA)['content'].splitlines()
               if l.startswith('[FILE]'))
hits = [n for n in names if 'ERROR' in files_read_text_file(path=f'{DATA}/{n}')['content']]
files_write_file(path=f'{DATA}/summary.txt', content='files with errors: ' + ', '.join(hits))
hits
"""


def wire(model: Any) -> dict[str, Any]:
    data = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    return data if isinstance(data, dict) else {}


def texts(result: Any) -> str:
    return "\n".join(str(c.get("text", "")) for c in wire(result).get("content", []) if c.get("type") == "text")


def make_data(root: Path, n: int = 20) -> Path:
    data = root / "data"
    data.mkdir()
    for i in range(n):
        lines = [f"2026-12-01T10:{i:02d}:{j:02d} INFO request {j} served in {j * 3} ms" for j in range(40)]
        if i % 4 == 0:
            lines[17] = f"2026-12-01T10:{i:02d}:17 ERROR upstream timed out"
        (data / f"service{i:02d}.log").write_text("\n".join(lines) + "\n")
    return data


async def direct(data: Path) -> int:
    """Bytes the model reads with the filesystem server used directly."""
    params = StdioServerParameters(command="npx", args=["-y", FS, str(data)])
    async with stdio_client(params) as streams, ClientSession(streams[0], streams[1]) as s:
        await s.initialize()
        total = len(json.dumps(wire(await s.list_tools())))  # every definition, up front
        listing_args = {"path": str(data)}
        listing = await s.call_tool("list_directory", listing_args)
        total += len(json.dumps(listing_args)) + len(texts(listing))
        hits = []
        for line in texts(listing).splitlines():
            if not line.startswith("[FILE]"):
                continue
            name = line.split("] ", 1)[1]
            args = {"path": f"{data}/{name}"}
            body = texts(await s.call_tool("read_text_file", args))
            total += len(json.dumps(args)) + len(body)  # each intermediate result goes through the model
            if "ERROR" in body:
                hits.append(name)
        args = {"path": f"{data}/summary.txt", "content": "files with errors: " + ", ".join(hits)}
        total += len(json.dumps(args)) + len(texts(await s.call_tool("write_file", args)))
    return total


def proctor_server(data: Path, root: Path) -> StdioServerParameters:
    (root / "servers.json").write_text(json.dumps({"mcpServers": {"files": {"command": "npx",
                                                                            "args": ["-y", FS, str(data)]}}}))
    (root / "policy.yaml").write_text(POLICY)
    return StdioServerParameters(command=sys.executable, args=[
        "-m", "proctor.cli", "mcp", "serve", "--servers", str(root / "servers.json"), "--policy",
        str(root / "policy.yaml"), "--audit", str(root / "audit.jsonl"), "--user", "bench"])


async def code_mode(data: Path, root: Path) -> tuple[int, str]:
    """(bytes the model reads, the program's answer) through proctor."""
    async with stdio_client(proctor_server(data, root)) as streams, ClientSession(streams[0], streams[1]) as s:
        await s.initialize()
        total = len(json.dumps(wire(await s.list_tools())))
        for name in ("files_list_directory", "files_read_text_file", "files_write_file"):
            args = {"name": name}
            total += len(json.dumps(args)) + len(texts(await s.call_tool("describe_tool", args)))
        args = {"code": f"DATA = {str(data)!r}\n" + PROGRAM}
        answer = texts(await s.call_tool("run_python", args))
        total += len(json.dumps(args)) + len(answer)
    return total, answer


async def timed(data: Path, root: Path, calls: int, rounds: int) -> tuple[float, ...]:
    """Seconds per get_file_info call, (direct, governed) as batch means, as medians of single calls and
    as CPU time of every process involved (`tree_cpu_ns`; 0 where /proc is missing): both sessions open
    at once, batches of `calls` alternating `rounds` times (a shared machine's load then weighs on both
    alike), medians over the batches. The governed calls are timed one by one in the program
    (`time.perf_counter_ns()` around each), the direct ones around each `call_tool`."""
    info = f"{data}/service00.log"
    direct_params = StdioServerParameters(command="npx", args=["-y", FS, str(data)])
    async with stdio_client(direct_params) as d_streams, ClientSession(d_streams[0], d_streams[1]) as d, \
            stdio_client(proctor_server(data, root)) as p_streams, ClientSession(p_streams[0], p_streams[1]) as p:
        await d.initialize()
        await p.initialize()
        one = {"code": f"import time\nfiles_get_file_info(path={info!r})\nNone"}
        loop = {"code": f"import time\nts = []\nfor _ in range({calls}):\n    t = time.perf_counter_ns()\n"
                        f"    files_get_file_info(path={info!r})\n    ts.append(time.perf_counter_ns() - t)\n"
                        "sorted(ts)[len(ts) // 2]"}
        await p.call_tool("run_python", one)  # warm: the sandbox is up
        await d.call_tool("get_file_info", {"path": info})
        direct_s: list[float] = []
        governed_s: list[float] = []
        direct_one: list[float] = []
        governed_one: list[float] = []
        direct_cpu: list[float] = []
        governed_cpu: list[float] = []
        for _ in range(rounds):
            each = []
            cpu0 = tree_cpu_ns()
            started = time.perf_counter()
            for _ in range(calls):
                t = time.perf_counter()
                await d.call_tool("get_file_info", {"path": info})
                each.append(time.perf_counter() - t)
            direct_s.append((time.perf_counter() - started) / calls)
            direct_cpu.append(_per_call(cpu0, tree_cpu_ns(), calls) or 0.0)
            direct_one.append(statistics.median(each))
            cpu0 = tree_cpu_ns()
            started = time.perf_counter()
            await p.call_tool("run_python", one)
            single, cpu1 = time.perf_counter() - started, tree_cpu_ns()
            started = time.perf_counter()
            answer = texts(await p.call_tool("run_python", loop))
            whole, cpu2 = time.perf_counter() - started, tree_cpu_ns()
            wall, cpu = _program_figure(single, whole, (cpu0, cpu1, cpu2), calls)  # a program's fixed cost out
            governed_s.append(wall)
            governed_cpu.append(cpu or 0.0)
            value = re.search(r"^value: (\d+)$", answer, re.M)
            if value is None:
                raise RuntimeError(f"the timed program did not answer:\n{answer}")
            governed_one.append(int(value.group(1)) / 1e9)
    return (statistics.median(direct_s), statistics.median(governed_s), statistics.median(direct_one),
            statistics.median(governed_one), statistics.median(direct_cpu), statistics.median(governed_cpu))


def tree_cpu_ns() -> int | None:
    """CPU time (ns) used so far by this process and every process under it (the MCP servers, `proctor mcp
    serve`, the sandboxed workers), summed over their threads from /proc (None where there is none). Time on
    a CPU, not waiting for one: a loaded machine moves it far less than it moves wall time."""
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            if pid == os.getpid():
                return None
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                    total += int(fh.read().split()[0])
                with open(f"/proc/{pid}/task/{tid}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
            except (OSError, ValueError, IndexError):
                continue  # a thread that ended meanwhile
    return total


Figure = tuple[float, float | None]  # seconds per call: wall, and CPU of every process involved


def layers(data: Path, root: Path, calls: int, rounds: int) -> list[tuple[str, Figure]]:
    """Seconds per get_file_info call at each layer a governed call crosses, one batch of `calls` per layer
    in turn, `rounds` times; medians. The first four run in this process; the last is (b)'s governed call,
    through the `proctor mcp serve` process, in the same alternation."""
    import threading

    from proctor.backends import load_audit
    from proctor.codemode.config import ServerConfig
    from proctor.codemode.server import CodeMode
    from proctor.integrations.mcp import MCPTool
    from proctor.policy import Policy

    info = f"{data}/service00.log"
    args = {"path": info}
    (root / "policy.yaml").write_text(POLICY)
    audit, _, _ = load_audit(str(root / "layers-audit.jsonl"))
    mode = CodeMode([ServerConfig("files", command="npx", args=("-y", FS, str(data)), prefix="files_")],
                    Policy.from_yaml(root / "policy.yaml"), audit=audit, user="bench")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="clients", daemon=True)
    thread.start()
    batches: asyncio.Queue[tuple[str, Future[Figure]] | None] = asyncio.Queue()
    one = f"files_get_file_info(path={info!r})\nNone"
    program = f"for _ in range({calls}):\n    files_get_file_info(path={info!r})\nNone"

    async def clients() -> None:  # the bench's own MCP clients, on a loop only they use; batches timed inside it
        params = StdioServerParameters(command="npx", args=["-y", FS, str(data)])
        async with stdio_client(params) as d_streams, ClientSession(d_streams[0], d_streams[1]) as direct_session, \
                stdio_client(proctor_server(data, root)) as p_streams, \
                ClientSession(p_streams[0], p_streams[1]) as served:
            await direct_session.initialize()
            await served.initialize()
            await direct_session.call_tool("get_file_info", args)
            await served.call_tool("run_python", {"code": one})  # warm: the sandbox is up
            while (job := await batches.get()) is not None:
                kind, reply = job
                if kind == "direct":
                    cpu0, started = tree_cpu_ns(), time.perf_counter()
                    for _ in range(calls):
                        await direct_session.call_tool("get_file_info", args)
                    wall, cpu1 = time.perf_counter() - started, tree_cpu_ns()
                    reply.set_result((wall / calls, _per_call(cpu0, cpu1, calls)))
                    continue
                cpu0, started = tree_cpu_ns(), time.perf_counter()
                await served.call_tool("run_python", {"code": one})
                single, cpu1 = time.perf_counter() - started, tree_cpu_ns()
                started = time.perf_counter()
                await served.call_tool("run_python", {"code": program})
                whole, cpu2 = time.perf_counter() - started, tree_cpu_ns()
                reply.set_result(_program_figure(single, whole, (cpu0, cpu1, cpu2), calls))

    def per_call(fn: Callable[[], object]) -> Figure:
        cpu0, started = tree_cpu_ns(), time.perf_counter()
        for _ in range(calls):
            fn()
        wall, cpu1 = time.perf_counter() - started, tree_cpu_ns()
        return wall / calls, _per_call(cpu0, cpu1, calls)

    try:
        mode.open()
        run = mode.session("layers", "bench")
        toolset, tool = mode.toolsets[0], next(t for t in mode.tools if t.name == "files_get_file_info")
        assert isinstance(tool, MCPTool)
        client = asyncio.run_coroutine_threadsafe(clients(), loop)
        mode.run_python(run, one)  # warm: the sandbox is up

        def interpreter() -> Figure:
            cpu0, started = tree_cpu_ns(), time.perf_counter()
            mode.run_python(run, one)
            single, cpu1 = time.perf_counter() - started, tree_cpu_ns()
            started = time.perf_counter()
            mode.run_python(run, program)
            whole, cpu2 = time.perf_counter() - started, tree_cpu_ns()
            return _program_figure(single, whole, (cpu0, cpu1, cpu2), calls)

        def on_clients(kind: str) -> Callable[[], Figure]:
            def measure() -> Figure:
                reply: Future[Figure] = Future()
                loop.call_soon_threadsafe(batches.put_nowait, (kind, reply))
                return reply.result()
            return measure

        def toolset_call() -> Figure:
            return per_call(lambda: toolset.call(tool, args))

        def gate_call() -> Figure:
            return per_call(lambda: mode.gate.call(tool, args, context=run.run))

        figures: dict[str, list[Figure]] = {}
        measures: list[tuple[str, Callable[[], Figure]]] = [
            ("direct MCP client session", on_clients("direct")), ("MCPToolset.call", toolset_call),
            ("gate.call", gate_call), ("Interpreter program", interpreter),
            ("proctor mcp serve (b)", on_clients("served"))]
        for _ in range(rounds):
            for name, measure in measures:
                figures.setdefault(name, []).append(measure())
        loop.call_soon_threadsafe(batches.put_nowait, None)
        client.result(60)
    finally:
        mode.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        if audit is not None:
            audit.close()
    out: list[tuple[str, Figure]] = []
    for name, values in figures.items():
        cpus = [c for _, c in values if c is not None]
        out.append((name, (statistics.median(w for w, _ in values), statistics.median(cpus) if cpus else None)))
    return out


def _per_call(before: int | None, after: int | None, calls: int) -> float | None:
    return (after - before) / calls / 1e9 if before is not None and after is not None else None


def _program_figure(single: float, whole: float, cpu: tuple[int | None, int | None, int | None],
                    calls: int) -> Figure:
    """Per call of a program of `calls` calls, a program of one call taken out (a program's fixed cost)."""
    c0, c1, c2 = cpu
    spent = (c2 - c1) - (c1 - c0) if c0 is not None and c1 is not None and c2 is not None else None
    return (whole - single) / (calls - 1), spent / (calls - 1) / 1e9 if spent is not None else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200, help="calls per batch for (b) (default 200)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating batches for (b) (default 5)")
    parser.add_argument("--layers", action="store_true", help="also (c): (b)'s time layer by layer")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = make_data(root)
        direct_bytes = asyncio.run(direct(data))
        (data / "summary.txt").unlink()
        mode_bytes, answer = asyncio.run(code_mode(data, root))
        direct_call, mode_call, direct_one, mode_one, direct_cpu, mode_cpu = asyncio.run(
            timed(data, root, args.calls, args.rounds))
        steps = layers(data, root, args.calls, args.rounds) if args.layers else []
    if "service00.log" not in answer:
        print(f"code mode did not do the task:\n{answer}", file=sys.stderr)
        return 1
    print("(a) bytes reaching the model's context: read 20 files, keep matches, write a summary")
    print(f"    direct tool calling  {direct_bytes:>9,} B")
    print(f"    code mode (proctor)  {mode_bytes:>9,} B   {mode_bytes / direct_bytes:.2f}x")
    print(f"(b) one upstream stdio call (filesystem get_file_info; median of {args.rounds} alternating batches "
          f"of {args.calls})")
    print(f"    direct MCP session   {direct_call * 1e6:>9,.0f} us")
    print(f"    governed, run_python {mode_call * 1e6:>9,.0f} us   {mode_call / direct_call:.2f}x (target <= 1.10x)")
    print("    the median single call of each batch, medians:")
    print(f"    direct MCP session   {direct_one * 1e6:>9,.0f} us")
    print(f"    governed, run_python {mode_one * 1e6:>9,.0f} us   {mode_one / direct_one:.2f}x")
    if direct_cpu:
        print("    CPU time per call of every process involved (client, servers, proctor, worker), medians:")
        print(f"    direct MCP session   {direct_cpu * 1e6:>9,.0f} us")
        print(f"    governed, run_python {mode_cpu * 1e6:>9,.0f} us   {mode_cpu / direct_cpu:.2f}x")
    if steps:
        print(f"(c) the same call layer by layer (median of {args.rounds} alternating batches of {args.calls}); each "
              "layer includes the ones above it; cpu: CPU time of every process involved (this one, the servers, "
              "proctor mcp serve, the workers), which load moves far less than wall time")
        base, base_cpu = steps[0][1]
        for name, (seconds, cpu) in steps:
            added = (seconds - base) * 1e6
            line = f"    {name:<26} {seconds * 1e6:>9,.0f} us   {seconds / base:.2f}x   {added:+,.0f} us"
            if cpu is not None and base_cpu:
                line += f"   cpu {cpu * 1e6:>7,.0f} us   {cpu / base_cpu:.2f}x"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
