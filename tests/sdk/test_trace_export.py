"""Span export off the serving process: the child's OTLP encoder writes what the SDK's encoder would,
and traces handed to the child reach an OTLP/HTTP collector."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.helpers import skip_without_extra

skip_without_extra("otel")

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

from sdk.observability.tracing.emit import Sink  # noqa: E402
from sdk.observability.tracing.export_process import ProcessSink  # noqa: E402
from sdk.observability.tracing.otlp_encoding import encode  # noqa: E402
from sdk.observability.tracing.records import Parent, RequestTrace, SpanRecord  # noqa: E402
from sdk.observability.tracing.setup import resource  # noqa: E402


class Caught:
    def __init__(self) -> None:
        self.spans: list = []

    def on_end(self, span) -> None:
        self.spans.append(span)

    def shutdown(self) -> None:
        pass


def _traces() -> list[RequestTrace]:
    root = SpanRecord("chat claude-x", 0x1234, 1_700_000_000_000_000_000, {
        "gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 12, "gen_ai.request.temperature": 0.5,
        "slipstream.stream": True, "gen_ai.response.finish_reasons": ("end_turn", "stop"), "big": 2**40, "negative": -3,
        "text": "naïve ✓ unicode", "long": "x" * 300, "huge": "y" * 20_000,
    }, end_ns=1_700_000_000_250_000_000)
    root.events.append(("gen_ai.first_token", 1_700_000_000_100_000_000, {"slipstream.ttft_ms": 100.5}))
    remote = RequestTrace(0x4BF92F3577B34DA6A3CE929D0E0E4736, root, Parent(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 1, "vendor=abc,other=1"))
    remote.children.append(SpanRecord("cache lookup", 0x55, 1_700_000_000_001_000_000, {"slipstream.cache.outcome": "miss"},
                                      end_ns=1_700_000_000_002_000_000))
    remote.children.append(SpanRecord("attempt claude/claude-a", 0x66, 1_700_000_000_003_000_000,
                                      {"slipstream.outcome": "failed", "error.type": "UpstreamHTTPError:500"}, client=True,
                                      end_ns=1_700_000_000_004_000_000, error="upstream answered 500"))
    local = RequestTrace(0x99, SpanRecord("passthrough files", 0x77, 5, {}, end_ns=9), Parent(0x99, 0x88, 3, "", remote=False))
    fresh = RequestTrace(0xABC, SpanRecord("embeddings m", 0x101, 10, {"slipstream.attempts": 0}, end_ns=20, error="boom"))
    return [remote, local, fresh]


def test_the_bytes_parse_to_what_the_sdk_encoder_makes():
    service = resource()
    caught = Caught()
    sink = Sink(caught, service)
    for trace in _traces():
        sink.emit(trace)
    expected = encode_spans(caught.spans)
    encoded = encode(_traces(), dict(service.attributes), "slipstream")
    ours = ExportTraceServiceRequest.FromString(encoded.SerializePartialToString())
    assert len(encoded) == len(caught.spans) == 5
    assert ours == expected


@pytest.fixture
def collector() -> Iterator[tuple[str, list[ExportTraceServiceRequest]]]:
    """An OTLP/HTTP traces endpoint on loopback that keeps what it receives; like a collector, it
    refuses a request over 4 MiB (the OpenTelemetry Collector's default for OTLP over gRPC) whole."""
    received: list[ExportTraceServiceRequest] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            assert self.headers["content-type"] == "application/x-protobuf"
            if len(body) > 4 * 1024 * 1024:
                self.send_response(413)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            received.append(ExportTraceServiceRequest.FromString(body))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", received
    server.shutdown()


def test_traces_handed_to_the_export_process_reach_the_collector(collector, monkeypatch):
    url, received = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-under-test")
    sink = ProcessSink()
    for trace in _traces():
        sink.emit(trace)
    sink.shutdown()  # flushes: the child exports what it holds when its stdin closes
    spans = [span for request in received for resource in request.resource_spans for scope in resource.scope_spans for span in scope.spans]
    assert sorted(span.name for span in spans) == sorted(["chat claude-x", "cache lookup", "attempt claude/claude-a", "passthrough files", "embeddings m"])
    services = {kv.value.string_value for request in received for resource in request.resource_spans
                for kv in resource.resource.attributes if kv.key == "service.name"}
    assert services == {"gateway-under-test"}
    attempt = next(span for span in spans if span.name.startswith("attempt "))
    assert attempt.parent_span_id == (0x1234).to_bytes(8, "big") and attempt.status.message == "upstream answered 500"


def _team_trace(trace_id: int, team: str, model: str, messages: str = "") -> RequestTrace:
    attributes = {"slipstream.team": team, "gen_ai.request.model": model}
    if messages:
        attributes["gen_ai.input.messages"] = messages
    return RequestTrace(trace_id, SpanRecord(f"chat {model}", trace_id, 1, attributes, end_ns=2))


def test_one_teams_large_spans_do_not_take_another_teams_spans_out_of_the_export(collector, monkeypatch):
    """Every team's spans travel in the same export requests, and a collector refuses a request over
    its size limit whole. With message capture on, a team's request of 5 MiB of messages, or many
    spans of large captured messages, made one export request too large, and the other team's span
    in it was lost. Values are cut at the attribute length limit (64 Ki characters) and an export
    request holds at most about 4 MiB of spans."""
    url, received = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url)
    sink = ProcessSink()
    sink.emit(_team_trace(1, "a", "gpt-x", messages="m" * (5 * 1024 * 1024)))
    for i in range(80):
        sink.emit(_team_trace(100 + i, "a", "gpt-x", messages="w" * 60_000))
    sink.emit(_team_trace(2, "b", "gpt-x"))
    sink.shutdown()
    teams = [kv.value.string_value for request in received for resource in request.resource_spans
             for scope in resource.scope_spans for span in scope.spans for kv in span.attributes if kv.key == "slipstream.team"]
    assert teams.count("b") == 1  # before: the one request was refused, team b's span with it
    assert teams.count("a") == 81


def test_one_teams_volume_does_not_take_another_teams_place_in_the_export_queue(collector, monkeypatch):
    """Traces wait for the export process in one queue, bounded: past MAX_PENDING new ones were dropped,
    whoever's, so a team whose traffic outran the collector had every other team's traces dropped
    with its own. Past the bound a team holding less than its share (the bound over the teams
    waiting) still gets its traces in, up to twice the bound in all."""
    from sdk.observability.tracing import export_process

    url, received = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url)
    monkeypatch.setattr(export_process, "MAX_PENDING", 10)
    monkeypatch.setattr(export_process, "GATHER_S", 60)  # the writer waits: everything below queues first
    sink = ProcessSink()
    for i in range(20):
        sink.emit(_team_trace(100 + i, "a", "gpt-x"))
    sink.emit(_team_trace(2, "b", "gpt-x"))
    sink.shutdown()  # the writer goes at once, and the child exports what it holds
    teams = [kv.value.string_value for request in received for resource in request.resource_spans
             for scope in resource.scope_spans for span in scope.spans for kv in span.attributes if kv.key == "slipstream.team"]
    assert teams.count("b") == 1  # before: dropped, team a's ten filling the queue
    assert teams.count("a") == 10
