"""A local OpenAI-compatible server for tests: serves recorded chat completions, records requests."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def completion(content: str | None = None, tool_calls: list[dict[str, Any]] | None = None, *,
               prompt_tokens: int = 120, completion_tokens: int = 30,
               model: str = "gpt-4o-mini-2024-07-18") -> dict[str, Any]:
    """A chat completion as OpenAI returns it (recorded shape)."""
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-AbC123", "object": "chat.completion", "created": 1732867200, "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
        "system_fingerprint": "fp_0ba0d124f1",
    }


def tool_call(call_id: str, name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


RATE_LIMITED = (429, {"error": {"message": "Rate limit reached for gpt-4o-mini in organization org-x on "
                                           "requests per min (RPM): Limit 3, Used 3, Requested 1.",
                                "type": "requests", "param": None, "code": "rate_limit_exceeded"}})
BAD_KEY = (401, {"error": {"message": "Incorrect API key provided: test. You can find your API key at "
                                      "https://platform.openai.com/account/api-keys.",
                           "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}})


@dataclass
class FakeOpenAI:
    """Replies in order; each reply is a completion dict, or (status, body)."""

    replies: list[Any]
    requests: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


@contextmanager
def serve(replies: list[Any]) -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI(list(replies))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            fake.requests.append({"path": self.path, "body": body})
            if self.path.rstrip("/") != "/v1/chat/completions" or not fake.replies:
                status, payload = 404, {"error": {"message": f"no reply for {self.path}", "type": "test"}}
            else:
                reply = fake.replies.pop(0)
                status, payload = reply if isinstance(reply, tuple) else (200, reply)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
