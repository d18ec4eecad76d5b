"""How tracing decides to turn on from the environment (sdk/tracing.py), without a collector."""

from __future__ import annotations

import logging
import sys

import pytest

from sdk import otel_metrics, tracing
from sdk.pipeline import RequestContext
from sdk.types import Endpoint, LLMRequest


@pytest.fixture(autouse=True)
def undecided(monkeypatch):
    for name in {*tracing.ENDPOINT_VARS, *otel_metrics.ENDPOINT_VARS}:
        monkeypatch.delenv(name, raising=False)
    tracing.reset()
    yield
    tracing.reset()
    otel_metrics.reset()


def _context() -> RequestContext:
    return RequestContext(LLMRequest(Endpoint.CHAT_COMPLETIONS, {"model": "gpt-5-mini", "messages": []}), team="t")


def test_without_an_otlp_endpoint_tracing_is_off():
    ctx = _context()
    assert tracing.begin(ctx) is None and ctx.span is None
    tracing.end(ctx, 200)  # nothing to close, nothing raised


def test_an_endpoint_without_the_extra_logs_one_clear_line_and_requests_go_on(monkeypatch, caplog):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/v1/traces")
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)  # as if not installed
    with caplog.at_level(logging.WARNING, logger="slipstream.tracing"):
        assert tracing.begin(_context()) is None
        assert tracing.begin(_context()) is None
    [record] = caplog.records
    assert "slipstream[otel]" in record.getMessage()


def test_an_endpoint_sets_up_the_otlp_http_exporter(monkeypatch):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    ctx = _context()
    span = tracing.begin(ctx)
    assert span is not None and span.name == "chat gpt-5-mini"
    processor = span._span_processor._span_processors[0]  # the SDK keeps no public accessor for these
    assert type(processor).__name__ == "BatchSpanProcessor"
    assert isinstance(processor._batch_processor._exporter, OTLPSpanExporter)
    processor.shutdown()  # the span stays unended, so nothing is sent to port 9, where nothing listens


def test_a_metrics_endpoint_without_the_extra_turns_only_the_metrics_off(monkeypatch, caplog):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://127.0.0.1:9/v1/metrics")
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.metric_exporter", None)
    otel_metrics.reset()
    with caplog.at_level(logging.WARNING, logger="slipstream.tracing"):
        otel_metrics.record(_context())  # nothing recorded, nothing raised
        assert tracing.begin(_context()) is None  # the traces variable is not set
    [record] = caplog.records
    assert "OpenTelemetry metrics are off" in record.getMessage() and "slipstream[otel]" in record.getMessage()
