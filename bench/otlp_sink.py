"""A stand-in OpenTelemetry collector for benchmarks: accepts OTLP/HTTP trace exports and drops them.

Run by bench/proxy_overhead.py --traced, so a traced proxy exports over the real OTLP exporter
(protobuf encoding, HTTP, batching) without a collector installed. `GET /stats` answers how many
exports and spans arrived, so the benchmark can show the spans really left the proxy.

    python bench/otlp_sink.py PORT
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

received = {"exports": 0, "spans": 0, "bytes": 0}


class Sink(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        export = ExportTraceServiceRequest.FromString(body)
        received["exports"] += 1
        received["bytes"] += len(body)
        received["spans"] += sum(len(scope.spans) for resource in export.resource_spans for scope in resource.scope_spans)
        self._answer(ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")

    def do_GET(self) -> None:
        self._answer(json.dumps(received).encode(), "application/json")

    def _answer(self, body: bytes, media_type: str) -> None:
        self.send_response(200)
        self.send_header("content-type", media_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
