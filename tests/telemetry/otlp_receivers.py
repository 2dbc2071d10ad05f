"""OTLP receivers for tests: http/protobuf and gRPC servers on localhost that decode what they get.

Both decode the real protobuf messages with `opentelemetry-proto`, the way a collector
would, so the tests exercise the real exporters end to end. Also a "black hole" that
accepts connections and never answers, to stand for a hung collector.
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
import zlib
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

__all__ = ["BlackHole", "GotSpan", "GrpcReceiver", "HttpReceiver", "closed_port"]


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


@dataclass
class GotSpan:
    """One decoded span."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    kind: int
    status_code: int
    status_message: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    start_ns: int
    end_ns: int


@dataclass
class _Store:
    spans: list[GotSpan] = field(default_factory=list)
    metric_names: set[str] = field(default_factory=set)
    metrics: list[Any] = field(default_factory=list)
    requests: int = 0
    headers: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_traces(self, req: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self.lock:
            self.requests += 1
            for rs in req.resource_spans:
                resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.spans.append(GotSpan(
                            name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex() or None, kind=s.kind, status_code=s.status.code,
                            status_message=s.status.message,
                            attributes={kv.key: _value(kv.value) for kv in s.attributes}, resource=resource,
                            start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano))

    def add_metrics(self, req: metrics_service_pb2.ExportMetricsServiceRequest) -> None:
        with self.lock:
            self.requests += 1
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        self.metric_names.add(m.name)
                        self.metrics.append(m)

    def wait_for(self, predicate: Callable[[list[GotSpan]], bool], timeout_s: float = 10.0) -> list[GotSpan]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                spans = list(self.spans)
            if predicate(spans):
                return spans
            time.sleep(0.02)
        with self.lock:
            return list(self.spans)


class HttpReceiver(_Store):
    """OTLP/HTTP (protobuf) on 127.0.0.1: POST /v1/traces and /v1/metrics."""

    def __init__(self) -> None:
        super().__init__()
        store = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with store.lock:
                    store.headers.append({k.lower(): v for k, v in self.headers.items()})
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if self.path == "/v1/traces":
                    store.add_traces(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                    reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                elif self.path == "/v1/metrics":
                    store.add_metrics(metrics_service_pb2.ExportMetricsServiceRequest.FromString(body))
                    reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class GrpcReceiver(_Store):
    """OTLP/gRPC on 127.0.0.1: TraceService and MetricsService."""

    def __init__(self) -> None:
        super().__init__()
        store = self

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                store.add_traces(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                store.add_metrics(request)
                return metrics_service_pb2.ExportMetricsServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{port}"

    def close(self) -> None:
        self.server.stop(grace=None).wait(5)


class BlackHole:
    """A TCP server that accepts connections, reads and never answers: a hung collector."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.endpoint = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = 0
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.setblocking(False)
            self._conns.append(conn)  # held open, never read to the end, never answered

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        for conn in self._conns:
            conn.close()
        self.sock.close()


def closed_port() -> str:
    """An endpoint on which nothing listens (a collector that is down)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"
