"""The inbox (issue #28.5): an approval page's latency with and without the request guard, side by side,
and what a held-open 48 MB body costs a real `proctor serve` process.

1. Latency: ``GET /approvals/{id}`` (logged in) and ``GET /api/approvals`` (bearer) against one app,
   served by uvicorn on loopback, once as `create_app` makes it (RequestGuard outside everything: the
   headers, the body checks) and once with the guard's layer taken out (the same routes and
   templates), requests interleaved so the machine's drift touches both alike; medians and the ratio.
2. Memory: a `proctor serve` process is sent the head of a 48 MB urlencoded ``/login`` body, declared
   (Content-Length) and chunked, and then body bytes until it answers; its VmRSS before and after,
   the bytes it took before answering, and the status.

Run: .venv/bin/python bench/inbox.py [--requests 300]
"""

from __future__ import annotations

import argparse
import http.client
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastapi import FastAPI  # noqa: E402

from tests.serve.browser import free_port, serving  # noqa: E402
from tests.serve.inbox_helpers import Inbox  # noqa: E402
from tests.serve.test_inbox_hardening import FORTY_EIGHT_MB, _held_open  # noqa: E402


def unguarded(app: FastAPI) -> Any:
    """The same app without RequestGuard (the layer `InboxApp.build_middleware_stack` adds): Starlette
    builds its stack with FastAPI's own method instead."""
    app.build_middleware_stack = types.MethodType(FastAPI.build_middleware_stack, app)  # type: ignore[method-assign]
    return app


def timed(port: int, path: str, headers: dict[str, str]) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    start = time.perf_counter()
    conn.request("GET", path, headers=headers)
    response = conn.getresponse()
    response.read()
    elapsed = time.perf_counter() - start
    conn.close()
    assert response.status == 200, response.status
    return elapsed


def latency(requests: int) -> None:
    from proctor.approval.tokens import TokenFile
    from proctor.serve.app import create_app
    from proctor.store.base import RunStore

    tmp = Path(tempfile.mkdtemp())
    inbox = Inbox(tmp)
    approval_id = inbox.suspend()
    store = RunStore.open(inbox.store_url)
    guarded = create_app(store, TokenFile.load(inbox.tokens_path))
    plain = create_app(store, TokenFile.load(inbox.tokens_path))
    bare = unguarded(plain)
    bearer = {"Authorization": f"Bearer {inbox.tokens['bob']}"}
    with serving(guarded) as g_url, serving(bare) as p_url:
        ports = {"guarded": int(g_url.rsplit(":", 1)[1]), "unguarded": int(p_url.rsplit(":", 1)[1])}
        cookies = {}
        for name, port in ports.items():
            conn = http.client.HTTPConnection("127.0.0.1", port)
            conn.request("POST", "/login", body=f"token={inbox.tokens['bob']}",
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
            r = conn.getresponse()
            r.read()
            cookies[name] = {"Cookie": r.getheader("set-cookie", "").split(";", 1)[0]}
            conn.close()
        samples: dict[tuple[str, str], list[float]] = {}
        for _ in range(requests):
            for name, port in ports.items():
                for what, path, headers in (("page", f"/approvals/{approval_id}", cookies[name]),
                                            ("api", "/api/approvals", bearer)):
                    samples.setdefault((what, name), []).append(timed(port, path, headers))
    store.close()
    print(f"{'request':<34} {'guarded ms':>11} {'unguarded ms':>13} {'ratio':>7}")
    for what, label in (("page", "GET /approvals/{id} (session)"), ("api", "GET /api/approvals (bearer)")):
        g = statistics.median(samples[(what, "guarded")]) * 1e3
        u = statistics.median(samples[(what, "unguarded")]) * 1e3
        print(f"{label:<34} {g:>11.2f} {u:>13.2f} {g / u:>7.2f}")


def memory() -> None:
    tmp = Path(tempfile.mkdtemp())
    inbox = Inbox(tmp)
    port = free_port()
    with (tmp / "serve.log").open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "proctor.cli", "serve", "--store", inbox.store_url,
                                 "--tokens", str(inbox.tokens_path), "--port", str(port)], stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        kind = "Content-Type: application/x-www-form-urlencoded\r\n"
        print(f"\n48 MB held-open body to /login (unauthenticated), proctor serve pid {proc.pid}")
        print(f"{'body':<16} {'status':>6} {'bytes sent before the answer':>30} {'RSS growth KiB':>15}")
        for label, headers in (("Content-Length", kind + f"Content-Length: {FORTY_EIGHT_MB}\r\n"),
                               ("chunked", kind + "Transfer-Encoding: chunked\r\n")):
            status, sent, grown = _held_open(port, "/login", headers, proc.pid)
            print(f"{label:<16} {status:>6} {sent:>30,} {grown:>15,}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    threading.current_thread().name = "bench"
    latency(args.requests)
    memory()


if __name__ == "__main__":
    main()
