"""How tracing decides to turn on from the environment (sdk/observability/tracing/), without a collector."""

from __future__ import annotations

import logging
import sys

import pytest

from sdk.observability import otel_metrics, tracing
from sdk.observability.tracing.setup import EXPORT_VAR
from sdk.pipeline import RequestContext
from sdk.types import Endpoint, LLMRequest
from tests.helpers import requires_extra


@pytest.fixture(autouse=True)
def undecided(monkeypatch):
    for name in {*tracing.ENDPOINT_VARS, *otel_metrics.ENDPOINT_VARS, EXPORT_VAR}:
        monkeypatch.delenv(name, raising=False)
    tracing.reset()
    yield
    tracing.reset()
    otel_metrics.reset()


def _context() -> RequestContext:
    return RequestContext(LLMRequest(Endpoint.CHAT_COMPLETIONS, {"model": "gpt-5-mini", "messages": []}), team="t")


def test_without_an_otlp_endpoint_tracing_is_off():
    ctx = _context()
    assert tracing.begin(ctx) is None and ctx.trace is None
    tracing.end(ctx, 200)  # nothing to close, nothing raised


def test_an_endpoint_without_the_extra_logs_one_clear_line_and_requests_go_on(monkeypatch, caplog):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/v1/traces")
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)  # as if not installed
    with caplog.at_level(logging.WARNING, logger="slipstream.tracing"):
        assert tracing.begin(_context()) is None
        assert tracing.begin(_context()) is None
    [record] = caplog.records
    assert "slipstream[otel]" in record.getMessage()


@requires_extra("otel")
def test_an_endpoint_sets_up_the_otlp_http_exporter(monkeypatch):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    ctx = _context()
    trace = tracing.begin(ctx)
    assert trace is not None and trace.root.name == "chat gpt-5-mini" and ctx.trace is trace
    processor = tracing._sink.processor
    assert type(processor).__name__ == "BatchSpanProcessor"
    assert isinstance(processor._batch_processor._exporter, OTLPSpanExporter)  # the SDK keeps no public accessor
    processor.shutdown()  # the trace stays open, so nothing is sent to port 9, where nothing listens


@requires_extra("otel")
def test_the_proxy_exports_from_a_child_process(monkeypatch):
    from sdk.observability.tracing.export_process import ProcessSink

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv(EXPORT_VAR, "process")  # what `slipstream serve` sets unless told otherwise
    assert tracing.enabled()
    sink = tracing._sink
    assert isinstance(sink, ProcessSink)
    sink.shutdown()  # nothing was traced, so the child exits without sending anything


def test_a_metrics_endpoint_without_the_extra_turns_only_the_metrics_off(monkeypatch, caplog):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://127.0.0.1:9/v1/metrics")
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.metric_exporter", None)
    otel_metrics.reset()
    with caplog.at_level(logging.WARNING, logger="slipstream.tracing"):
        otel_metrics.record(_context(), "gpt-x", "none")  # nothing recorded, nothing raised
        assert tracing.begin(_context()) is None  # the traces variable is not set
    [record] = caplog.records
    assert "OpenTelemetry metrics are off" in record.getMessage() and "slipstream[otel]" in record.getMessage()


OFF_SCRIPT = """
import asyncio, sys
from sdk.policy import Policy
from sdk.runtime import TeamRuntime
from sdk.types import Endpoint, LLMRequest

policy = Policy.model_validate({"team": "t", "providers": {"gpt": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "api_key": "k"}},
                                "routes": [{"targets": [{"provider": "gpt"}]}], "retry": {"max_attempts": 1}})
runtime = TeamRuntime.build(policy)
body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
try:
    asyncio.run(runtime.handle(LLMRequest(Endpoint.CHAT_COMPLETIONS, body, {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})))
except Exception as exc:
    print("answered", type(exc).__name__)
print("opentelemetry loaded:", any(name.startswith("opentelemetry") for name in sys.modules))
"""


def test_off_means_no_opentelemetry_code_runs_at_all(tmp_path):
    """Without an endpoint a request (with a traceparent, through every default stage) never imports OpenTelemetry."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["SLIPSTREAM_DATA_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", OFF_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert "answered" in done.stdout, done.stderr
    assert "opentelemetry loaded: False" in done.stdout


@requires_extra("otel")
def test_a_malformed_or_unsampled_traceparent(monkeypatch):
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    tracing.install(SimpleSpanProcessor(InMemorySpanExporter()))
    for header in ("00-xyz-00f067aa0ba902b7-01", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "ff-" + "1" * 32 + "-" + "2" * 16 + "-01"):
        ctx = _context()
        ctx.request.forward_headers["traceparent"] = header
        trace = tracing.begin(ctx)
        assert trace is not None and trace.parent is None  # a new trace, as the W3C spec says
    ctx = _context()
    ctx.request.forward_headers["traceparent"] = "00-" + "1" * 32 + "-" + "2" * 16 + "-00"
    assert tracing.begin(ctx) is None  # the caller chose not to record it
