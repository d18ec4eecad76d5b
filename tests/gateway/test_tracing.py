"""OpenTelemetry traces through the real proxy in front of the emulator, caught by an in-memory exporter."""

from __future__ import annotations

import time
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from emulator.app import EmulatorConfig
from emulator.testing import running_emulator
from gateway.testing import running_proxy
from sdk import otel_metrics, tracing
from tests.routing.conftest import TWO_CLAUDES, policy_text

TEAM_KEY = "sk-routing"  # the keys policy_text writes
UPSTREAM_KEYS = ("up-anthropic", "up-openai")
EXTRA = """retry: {max_attempts: 2, base_delay_ms: 10, max_delay_ms: 50}
semantic_cache: {enabled: true, semantic: false}
prompt_cache: {enabled: false}
"""
PROMPT = "the password is marmalade"


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    caught = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(caught))
    tracing.install(provider)
    yield caught
    tracing.reset()


@pytest.fixture(scope="module")
def reader() -> Iterator[InMemoryMetricReader]:
    caught = InMemoryMetricReader()
    otel_metrics.install(MeterProvider(metric_readers=[caught]))
    yield caught
    otel_metrics.reset()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, exporter, reader):
    """A paced emulator (a stream lasts ~150 ms, long enough to leave) behind a traced proxy."""
    directory = tmp_path_factory.mktemp("tracing")
    with pytest.MonkeyPatch.context() as patch, running_emulator(EmulatorConfig(per_output_token_ms=5.0, default_output_tokens=30)) as upstream:
        patch.setenv("SLIPSTREAM_DATA_DIR", str(directory / "data"))  # a response cache of its own, empty
        (directory / "traced.yaml").write_text(policy_text(upstream.url, TWO_CLAUDES, EXTRA))
        with running_proxy([directory]) as proxy:
            yield upstream, proxy


@pytest.fixture
def traced(stack, exporter):
    upstream, proxy = stack
    httpx.post(f"{upstream.url}/_emulator/reset").raise_for_status()
    exporter.clear()
    return upstream, proxy


def _request_spans(exporter: InMemorySpanExporter, count: int = 1, timeout_s: float = 3.0) -> list[ReadableSpan]:
    """The finished request spans (those without the attempt prefix), once `count` of them have ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [s for s in exporter.get_finished_spans() if not s.name.startswith("attempt ")]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.01)


def _attempts(exporter: InMemorySpanExporter, parent: ReadableSpan) -> list[ReadableSpan]:
    spans = [s for s in exporter.get_finished_spans() if s.parent is not None and s.parent.span_id == parent.context.span_id]
    return sorted(spans, key=lambda s: s.start_time)


def _claude(proxy) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=TEAM_KEY, max_retries=0)


def test_a_request_is_one_span_with_genai_attributes_and_an_attempt_child(traced, exporter):
    _, proxy = traced
    reply = _claude(proxy).messages.create(model="claude-x", max_tokens=64, messages=[{"role": "user", "content": PROMPT}])
    [span] = _request_spans(exporter)
    attributes = dict(span.attributes)
    assert span.name == "chat claude-x"
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "anthropic"
    assert attributes["gen_ai.request.model"] == "claude-x"
    assert attributes["gen_ai.response.model"] == reply.model
    assert attributes["gen_ai.usage.input_tokens"] == reply.usage.input_tokens
    assert attributes["gen_ai.usage.output_tokens"] == reply.usage.output_tokens > 0
    assert attributes["gen_ai.response.finish_reasons"] == (reply.stop_reason,)
    assert attributes["slipstream.team"] == "routing"
    assert attributes["slipstream.route"] == "claude/claude-a"
    assert attributes["slipstream.cache"] == "miss"
    assert attributes["slipstream.attempts"] == 1
    assert attributes["http.response.status_code"] == 200
    [attempt] = _attempts(exporter, span)
    assert attempt.context.trace_id == span.context.trace_id
    assert attempt.attributes["slipstream.target"] == "claude/claude-a"
    assert attempt.attributes["slipstream.outcome"] == "ok"


def test_a_retry_then_fallback_shows_two_attempts_the_first_failed(traced, exporter):
    upstream, proxy = traced
    httpx.post(f"{upstream.url}/_emulator/faults", json={"fault": "500", "count": 1, "match": {"model": "claude-a"}}).raise_for_status()
    _claude(proxy).messages.create(model="claude-x", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    [span] = _request_spans(exporter)
    assert span.attributes["slipstream.attempts"] == 2
    assert span.attributes["slipstream.route"] == "claude/claude-b"
    failed, answered = _attempts(exporter, span)
    assert (failed.attributes["slipstream.target"], failed.attributes["slipstream.outcome"]) == ("claude/claude-a", "failed")
    assert failed.attributes["error.type"] == "UpstreamHTTPError:500"
    assert (answered.attributes["slipstream.target"], answered.attributes["slipstream.outcome"]) == ("claude/claude-b", "ok")


def test_an_incoming_traceparent_is_the_parent_and_the_attempt_is_propagated_upstream(traced, exporter):
    upstream, proxy = traced
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    response = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        headers={"authorization": f"Bearer {TEAM_KEY}", "traceparent": f"00-{trace_id}-{parent_id}-01"},
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.5},
    )
    assert response.status_code == 200
    [span] = _request_spans(exporter)
    assert f"{span.context.trace_id:032x}" == trace_id
    assert f"{span.parent.span_id:016x}" == parent_id
    assert span.attributes["gen_ai.provider.name"] == "openai"
    [attempt] = _attempts(exporter, span)
    [sent] = httpx.get(f"{upstream.url}/_emulator/requests").json()["requests"]
    assert sent["headers"]["traceparent"] == f"00-{trace_id}-{attempt.context.span_id:016x}-01"


def test_a_stream_left_early_ends_its_span_as_cancelled(traced, exporter):
    _, proxy = traced
    body = {"model": "claude-x", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "a story"}]}
    headers = {"x-api-key": TEAM_KEY, "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", f"{proxy.url}/v1/messages", headers=headers, json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line == "event: content_block_delta":  # the first token has passed: leave mid-answer
                break
    [span] = _request_spans(exporter)
    assert span.attributes["slipstream.status"] == "cancelled"
    assert span.attributes["slipstream.stream"] is True
    assert [event.name for event in span.events] == ["gen_ai.first_token"]
    [attempt] = _attempts(exporter, span)
    assert attempt.attributes["slipstream.outcome"] == "ok"  # the attempt ends at its first byte


def test_a_cache_hit_is_a_span_without_attempts(traced, exporter):
    _, proxy = traced
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=TEAM_KEY, max_retries=0)
    for _ in range(2):
        client.chat.completions.create(model="gpt-4o", temperature=0, messages=[{"role": "user", "content": "cache me"}])
    miss, hit = sorted(_request_spans(exporter, 2), key=lambda s: s.start_time)
    assert (miss.attributes["slipstream.cache"], hit.attributes["slipstream.cache"]) == ("miss", "exact-hit")
    assert hit.attributes["slipstream.attempts"] == 0 and _attempts(exporter, hit) == []


def _values(spans: list[ReadableSpan]) -> str:
    texts = [str(value) for s in spans for value in s.attributes.values()]
    texts += [str(value) for s in spans for event in s.events for value in event.attributes.values()]
    return "\n".join(texts)


def test_no_key_or_prompt_in_any_attribute_without_the_opt_in(traced, exporter, monkeypatch):
    _, proxy = traced
    _claude(proxy).messages.create(model="claude-x", max_tokens=16, messages=[{"role": "user", "content": PROMPT}])
    _request_spans(exporter)
    seen = _values(list(exporter.get_finished_spans()))
    for secret in (TEAM_KEY, *UPSTREAM_KEYS, "marmalade"):
        assert secret not in seen

    monkeypatch.setenv(tracing.CAPTURE_VAR, "true")
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)  # the opt-in is read when tracing is set up
    try:
        exporter.clear()
        _claude(proxy).messages.create(model="claude-x", max_tokens=16, messages=[{"role": "user", "content": PROMPT}])
        [span] = _request_spans(exporter)
        assert "marmalade" in span.attributes["gen_ai.input.messages"]
        assert "gen_ai.output.messages" in span.attributes
        assert TEAM_KEY not in _values([span])
    finally:
        monkeypatch.delenv(tracing.CAPTURE_VAR)
        tracing.install(provider)


def _points(reader: InMemoryMetricReader) -> dict[str, list]:
    data = reader.get_metrics_data()
    return {metric.name: list(metric.data.data_points)
            for resource in data.resource_metrics for scope in resource.scope_metrics for metric in scope.metrics}


def _claude_a(points: list) -> dict[str, object]:
    """The points of answers from claude-a, by token type ('' for the duration histogram)."""
    return {p.attributes.get("gen_ai.token.type", ""): p for p in points if p.attributes.get("gen_ai.response.model") == "claude-a"}


def test_genai_metrics_are_recorded_beside_prometheus(traced, reader):
    _, proxy = traced
    before = _points(reader).get("gen_ai.client.operation.duration", [])
    count_before = sum(p.count for p in _claude_a(before).values())
    reply = _claude(proxy).messages.create(model="claude-x", max_tokens=16, messages=[{"role": "user", "content": "count"}])
    points = _points(reader)
    duration = _claude_a(points["gen_ai.client.operation.duration"])[""]
    assert duration.count == count_before + 1  # cumulative
    assert duration.attributes["gen_ai.operation.name"] == "chat"
    assert duration.attributes["gen_ai.provider.name"] == "anthropic"
    assert duration.attributes["gen_ai.request.model"] == "claude-x"
    tokens = _claude_a(points["gen_ai.client.token.usage"])
    assert set(tokens) == {"input", "output"}
    assert tokens["output"].max >= reply.usage.output_tokens > 0


def test_a_responses_request_translated_to_anthropic_is_traced_like_any_other(traced, exporter):
    _, proxy = traced
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=TEAM_KEY, max_retries=0)
    reply = client.responses.create(model="claude-x", input="hello", max_output_tokens=32, store=False)
    [span] = _request_spans(exporter)
    assert span.name == "chat claude-x"
    assert span.attributes["slipstream.endpoint"] == "responses"
    assert span.attributes["gen_ai.provider.name"] == "anthropic"  # the answering target, not the client's dialect
    assert span.attributes["gen_ai.request.max_tokens"] == 32
    assert span.attributes["gen_ai.usage.output_tokens"] == reply.usage.output_tokens > 0
    [attempt] = _attempts(exporter, span)
    assert attempt.attributes["slipstream.target"] == "claude/claude-a"
    assert attempt.attributes["slipstream.outcome"] == "ok"
