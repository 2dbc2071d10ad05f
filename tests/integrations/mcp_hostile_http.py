"""A hostile MCP server over streamable HTTP, written without the SDK so that it can break every rule:
`python mcp_hostile_http.py PORT MODE LOG`.

It answers initialize and tools/list as JSON (one tool, ``bomb``) and logs each request's method and
Accept-Encoding to LOG. MODE says what ``bomb`` answers: ``gzip`` (a JSON answer of 200 MB compressed
to some 200 KB, compressed whatever the client asked for), ``sse-cr`` and ``sse-split`` (an SSE stream of small
events, 160 KB in all: see `Handler.events`), anything else (``done``).
"""

from __future__ import annotations

import json
import sys
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PORT, MODE, LOG = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])


def gzip_bomb(mid: object, megabytes: int) -> bytes:
    """A JSON-RPC answer whose text is `megabytes` MB, gzipped (about a thousandth of that)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = '{"jsonrpc": "2.0", "id": ' + json.dumps(mid) + ', "result": {"content": [{"type": "text", "text": "'
    parts = [packer.compress(head.encode())]
    block = b"y" * (1 << 20)
    parts += [packer.compress(block) for _ in range(megabytes)]
    parts += [packer.compress(b'"}]}}'), packer.flush()]
    return b"".join(parts)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def reply(self, status: int, body: bytes = b"", **headers: str) -> None:
        self.send_response(status)
        for name, value in {"Content-Length": str(len(body)), "mcp-session-id": "s1", **headers}.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # no stream of the server's own
        self.reply(405)

    def do_DELETE(self) -> None:
        self.reply(200)

    def do_POST(self) -> None:
        msg = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        mid, method = msg.get("id"), msg.get("method")
        with LOG.open("a") as fh:
            fh.write(f"{method} {self.headers.get('Accept-Encoding')}\n")
        if mid is None:
            self.reply(202)
        elif method == "initialize":
            self.answer(mid, {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                              "serverInfo": {"name": "hostile-http", "version": "0"}})
        elif method == "tools/list":
            self.answer(mid, {"tools": [{"name": "bomb", "inputSchema": {"type": "object", "properties": {}}}]})
        elif MODE == "gzip":
            self.reply(200, gzip_bomb(mid, 200), Content_Type="application/json", Content_Encoding="gzip")
        elif MODE.startswith("sse-"):
            self.events(mid)
        else:
            self.answer(mid, {"content": [{"type": "text", "text": "done"}]})

    def events(self, mid: object) -> None:
        """Four log notifications of 40 KB, then the answer, as one SSE stream (160 KB in all): ``sse-cr`` ends its
        lines with CR alone (as SSE allows), ``sse-split`` sends each event's blank line apart from it, a moment
        later (so that the two line ends that end an event come in different reads)."""
        import time

        eol = "\r" if MODE == "sse-cr" else "\n"
        notes = [{"jsonrpc": "2.0", "method": "notifications/message",
                  "params": {"level": "info", "data": "n" * 40_000}} for _ in range(4)]
        answer = {"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": "done"}]}}
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("mcp-session-id", "s1")
        self.send_header("Connection", "close")
        self.end_headers()
        for event in [*notes, answer]:
            self.wfile.write(f"event: message{eol}data: {json.dumps(event)}{eol}".encode())
            if MODE == "sse-split":
                self.wfile.flush()
                time.sleep(0.1)
            self.wfile.write(eol.encode())
            self.wfile.flush()
        self.close_connection = True

    def answer(self, mid: object, result: object) -> None:
        self.reply(200, json.dumps({"jsonrpc": "2.0", "id": mid, "result": result}).encode(),
                   Content_Type="application/json")


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
