"""OpenTelemetry traces through the real proxy in front of the emulator, caught by an in-memory exporter:
the span tree (request span, a child per stage that did work and per upstream attempt) and its attributes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from tests.helpers import PATIENCE_S, skip_without_extra

skip_without_extra("otel")

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

from emulator.app import EmulatorConfig  # noqa: E402
from emulator.testing import running_emulator  # noqa: E402
from gateway.testing import running_proxy  # noqa: E402
from sdk.observability import otel_metrics, tracing  # noqa: E402
from tests.routing.conftest import TWO_CLAUDES, policy_text  # noqa: E402

TEAM_KEY = "sk-routing"  # the keys policy_text writes
HEDGED_KEY = "sk-hedged-team"
UPSTREAM_KEYS = ("up-anthropic", "up-openai")
EXTRA = """retry: {max_attempts: 2, base_delay_ms: 10, max_delay_ms: 50}
semantic_cache: {enabled: true, semantic: false}
prompt_cache: {enabled: false}
"""
PROMPT = "the password is marmalade"


def hedged_policy(url: str) -> str:
    """A second team: hedging after 50 ms, a rate limit, the prompt-cache stage on and embeddings."""
    return f"""team: hedged
api_keys: [{{value: "{HEDGED_KEY}"}}]
providers:
  claude: {{kind: anthropic, base_url: "{url}", api_key: "up-anthropic"}}
  gpt: {{kind: openai, base_url: "{url}/v1", api_key: "up-openai"}}
routes:
  - match: {{model: "claude-*"}}
    targets: [{{provider: claude, model: claude-a}}, {{provider: claude, model: claude-b}}]
  - match: {{model: "text-embedding-*"}}
    targets: [{{provider: gpt}}]
hedging: {{enabled: true, delay_ms: 50}}
limits: {{requests_per_minute: 100000}}
semantic_cache: {{enabled: false}}
"""


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    caught = InMemorySpanExporter()
    tracing.install(SimpleSpanProcessor(caught))
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
        (directory / "hedged.yaml").write_text(hedged_policy(upstream.url))
        with running_proxy([directory]) as proxy:
            yield upstream, proxy


@pytest.fixture
def traced(stack, exporter):
    upstream, proxy = stack
    httpx.post(f"{upstream.url}/_emulator/reset").raise_for_status()
    exporter.clear()
    return upstream, proxy


def _request_spans(exporter: InMemorySpanExporter, count: int = 1, timeout_s: float = PATIENCE_S) -> list[ReadableSpan]:
    """The finished request spans (no parent in this process), once `count` of them have ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [s for s in exporter.get_finished_spans() if s.parent is None or s.parent.is_remote]
        if len(found) >= count or time.monotonic() > deadline:
            return sorted(found, key=lambda s: s.start_time)
        time.sleep(0.01)


def _children(exporter: InMemorySpanExporter, parent: ReadableSpan) -> list[ReadableSpan]:
    spans = [s for s in exporter.get_finished_spans() if s.parent is not None and s.parent.span_id == parent.context.span_id]
    for span in spans:
        assert span.context.trace_id == parent.context.trace_id
        assert parent.start_time <= span.start_time <= span.end_time <= parent.end_time
    return sorted(spans, key=lambda s: s.start_time)


def _names(spans: list[ReadableSpan]) -> list[str]:
    return [span.name for span in spans]


def _claude(proxy, key: str = TEAM_KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0)


def _fault(upstream, fault: str, model: str, count: int = 1) -> None:
    httpx.post(f"{upstream.url}/_emulator/faults", json={"fault": fault, "count": count, "match": {"model": model}}).raise_for_status()


def test_a_request_is_a_span_with_genai_attributes_a_cache_lookup_and_an_attempt(traced, exporter):
    _, proxy = traced
    reply = _claude(proxy).messages.create(model="claude-x", max_tokens=64, extra_body={"temperature": 0},
                                           messages=[{"role": "user", "content": PROMPT}])
    [span] = _request_spans(exporter)
    attributes = dict(span.attributes)
    assert span.name == "chat claude-x" and span.kind is SpanKind.INTERNAL
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "anthropic"
    assert attributes["gen_ai.request.model"] == "claude-x"
    assert attributes["gen_ai.request.max_tokens"] == 64
    assert attributes["gen_ai.response.model"] == reply.model
    assert attributes["gen_ai.response.id"] == reply.id
    assert attributes["gen_ai.usage.input_tokens"] == reply.usage.input_tokens
    assert attributes["gen_ai.usage.output_tokens"] == reply.usage.output_tokens > 0
    assert attributes["gen_ai.response.finish_reasons"] == (reply.stop_reason,)
    assert attributes["slipstream.team"] == "routing"
    assert attributes["slipstream.route"] == "claude/claude-a"
    assert attributes["slipstream.cache"] == "miss"
    assert attributes["slipstream.attempts"] == 1
    assert attributes["http.response.status_code"] == 200
    lookup, attempt = _children(exporter, span)
    assert (lookup.name, lookup.attributes["slipstream.cache.outcome"]) == ("cache lookup", "miss")
    assert attempt.name == "attempt claude/claude-a" and attempt.kind is SpanKind.CLIENT
    assert attempt.attributes["slipstream.target"] == "claude/claude-a"
    assert (attempt.attributes["slipstream.attempt.kind"], attempt.attributes["slipstream.outcome"]) == ("first", "ok")


def test_a_cached_hit_is_a_span_with_its_lookup_and_no_attempt(traced, exporter):
    _, proxy = traced
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=TEAM_KEY, max_retries=0)
    for _ in range(2):
        client.chat.completions.create(model="gpt-4o", temperature=0, messages=[{"role": "user", "content": "cache me"}])
    miss, hit = _request_spans(exporter, 2)
    assert (miss.attributes["slipstream.cache"], hit.attributes["slipstream.cache"]) == ("miss", "exact-hit")
    assert _names(_children(exporter, miss)) == ["cache lookup", "attempt gpt/gpt-4o"]
    [lookup] = _children(exporter, hit)
    assert (lookup.name, lookup.attributes["slipstream.cache.outcome"]) == ("cache lookup", "exact-hit")
    assert hit.attributes["slipstream.attempts"] == 0
    assert hit.attributes["slipstream.route"] == "cache/gpt/gpt-4o"
    assert hit.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert hit.attributes["gen_ai.usage.output_tokens"] == 0  # nothing was spent


def test_a_miss_with_a_fallback_and_a_retry_shows_each_attempt(traced, exporter):
    upstream, proxy = traced
    _fault(upstream, "500", "claude-a")
    _fault(upstream, "529", "claude-b")
    _claude(proxy).messages.create(model="claude-x", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    [span] = _request_spans(exporter)
    assert span.attributes["slipstream.attempts"] == 3
    assert span.status.status_code is StatusCode.UNSET  # the request succeeded in the end
    attempts = _children(exporter, span)  # no cache lookup: a sampled request (no temperature) is never cached
    seen = [(a.attributes["slipstream.target"], a.attributes["slipstream.attempt.kind"], a.attributes["slipstream.outcome"],
             a.attributes.get("error.type")) for a in attempts]
    assert seen[:2] == [("claude/claude-a", "first", "failed", "UpstreamHTTPError:500"),
                        ("claude/claude-b", "fallback", "failed", "UpstreamHTTPError:529")]
    retried = attempts[2].attributes["slipstream.target"]  # whichever target's jittered backoff ended first
    assert seen[2] == (retried, "retry", "ok", None) and span.attributes["slipstream.route"] == retried
    assert [a.status.status_code for a in attempts] == [StatusCode.ERROR, StatusCode.ERROR, StatusCode.UNSET]


def test_a_hedge_leg_wins_and_the_slow_leg_is_cancelled_and_the_prompt_cache_plan_is_a_span(traced, exporter):
    upstream, proxy = traced
    _fault(upstream, "stall:ms=600", "claude-a")
    _claude(proxy, HEDGED_KEY).messages.create(model="claude-x", max_tokens=16, messages=[{"role": "user", "content": "race"}])
    [span] = _request_spans(exporter)
    limits, *rest = _children(exporter, span)
    assert (limits.name, limits.attributes["slipstream.limits.outcome"]) == ("limits admit", "admitted")
    plans = [child for child in rest if child.name == "prompt_cache plan"]  # each attempt plans the body it sends
    attempts = [child for child in rest if child.name.startswith("attempt ")]
    assert len(plans) == 2 and len(plans) + len(attempts) == len(rest)
    for plan in plans:
        assert plan.attributes["slipstream.prompt_cache.expected_read"] == 0
        assert plan.attributes["slipstream.prompt_cache.miss_cause"]
    seen = {a.attributes["slipstream.target"]: (a.attributes["slipstream.attempt.kind"], a.attributes["slipstream.outcome"])
            for a in attempts}
    assert seen == {"claude/claude-a": ("first", "cancelled"), "claude/claude-b": ("hedge", "ok")}
    assert span.attributes["slipstream.route"] == "claude/claude-b"


def test_an_embeddings_batch_answered_from_the_vector_cache_has_no_attempt(traced, exporter):
    _, proxy = traced
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=HEDGED_KEY, max_retries=0)
    for _ in range(2):
        client.embeddings.create(model="text-embedding-3-small", input=["one vector", "two vectors"])
    first, second = _request_spans(exporter, 2)
    assert first.name == "embeddings text-embedding-3-small"
    assert _names(_children(exporter, first)) == ["limits admit", "embedding_cache lookup", "attempt gpt/text-embedding-3-small"]
    _, lookup = _children(exporter, second)
    assert (lookup.attributes["slipstream.embedding_cache.hits"], lookup.attributes["slipstream.embedding_cache.misses"]) == (2, 0)


def test_an_incoming_traceparent_is_the_parent_and_the_attempt_is_propagated_upstream(traced, exporter):
    upstream, proxy = traced
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    response = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        headers={"authorization": f"Bearer {TEAM_KEY}", "traceparent": f"00-{trace_id}-{parent_id}-01",
                 "tracestate": "vendor=abc"},
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.5},
    )
    assert response.status_code == 200
    [span] = _request_spans(exporter)
    assert f"{span.context.trace_id:032x}" == trace_id
    assert f"{span.parent.span_id:016x}" == parent_id and span.parent.is_remote
    assert span.attributes["gen_ai.provider.name"] == "openai"
    assert span.attributes["gen_ai.request.temperature"] == 0.5
    [attempt] = [s for s in _children(exporter, span) if s.name.startswith("attempt ")]
    [sent] = httpx.get(f"{upstream.url}/_emulator/requests").json()["requests"]
    assert sent["headers"]["traceparent"] == f"00-{trace_id}-{attempt.context.span_id:016x}-01"
    assert sent["headers"]["tracestate"] == "vendor=abc"


def test_an_unsampled_traceparent_is_not_recorded_and_passes_upstream_unchanged(traced, exporter):
    upstream, proxy = traced
    incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
    response = httpx.post(f"{proxy.url}/v1/chat/completions", headers={"authorization": f"Bearer {TEAM_KEY}", "traceparent": incoming},
                          json={"model": "gpt-4o", "messages": [{"role": "user", "content": "quiet"}], "temperature": 0.5})
    assert response.status_code == 200
    assert _request_spans(exporter, timeout_s=0.3) == []
    [sent] = httpx.get(f"{upstream.url}/_emulator/requests").json()["requests"]
    assert sent["headers"]["traceparent"] == incoming


def test_streams_carry_their_finish_reasons_and_first_token_event(traced, exporter):
    _, proxy = traced
    with _claude(proxy).messages.stream(model="claude-x", max_tokens=64, messages=[{"role": "user", "content": "a poem"}]) as stream:
        final = stream.get_final_message()
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=TEAM_KEY, max_retries=0)
    chunks = list(client.chat.completions.create(model="gpt-4o", stream=True, temperature=0.7,
                                                 messages=[{"role": "user", "content": "a song"}]))
    claude, gpt = _request_spans(exporter, 2)
    assert claude.attributes["gen_ai.response.finish_reasons"] == (final.stop_reason,)
    assert gpt.attributes["gen_ai.response.finish_reasons"] == (chunks[-1].choices[0].finish_reason,) == ("stop",)
    for span in (claude, gpt):
        assert span.attributes["slipstream.stream"] is True and span.attributes["slipstream.status"] == "200"
        [event] = span.events
        assert event.name == "gen_ai.first_token" and event.attributes["slipstream.ttft_ms"] > 0
        assert span.start_time < event.timestamp < span.end_time


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
    assert "gen_ai.response.finish_reasons" not in span.attributes  # it never finished
    assert [event.name for event in span.events] == ["gen_ai.first_token"]
    [attempt] = _children(exporter, span)
    assert attempt.attributes["slipstream.outcome"] == "ok"  # the attempt ends at its first byte


def test_a_responses_request_translated_to_anthropic_is_traced_like_any_other(traced, exporter):
    _, proxy = traced
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=TEAM_KEY, max_retries=0)
    reply = client.responses.create(model="claude-x", input="hello", max_output_tokens=32, temperature=0, store=False)
    [span] = _request_spans(exporter)
    assert span.name == "chat claude-x"
    assert span.attributes["slipstream.endpoint"] == "responses"
    assert span.attributes["gen_ai.provider.name"] == "anthropic"  # the answering target, not the client's dialect
    assert span.attributes["gen_ai.request.max_tokens"] == 32
    assert span.attributes["gen_ai.usage.output_tokens"] == reply.usage.output_tokens > 0
    assert span.attributes["gen_ai.response.finish_reasons"] == (reply.status,) == ("completed",)
    lookup, attempt = _children(exporter, span)
    assert (lookup.name, lookup.attributes["slipstream.cache.outcome"]) == ("cache lookup", "miss")
    assert attempt.attributes["slipstream.target"] == "claude/claude-a"
    assert attempt.attributes["gen_ai.provider.name"] == "anthropic"
    assert attempt.attributes["slipstream.outcome"] == "ok"


def test_a_passthrough_request_is_one_span_whose_traceparent_goes_upstream(traced, exporter):
    upstream, proxy = traced
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=TEAM_KEY, max_retries=0)
    client.completions.create(model="gpt-3.5-turbo-instruct", prompt=PROMPT, max_tokens=8)
    [span] = _request_spans(exporter)
    assert span.name == "passthrough completions"
    assert span.attributes["gen_ai.operation.name"] == "text_completion"
    assert span.attributes["slipstream.route"] == "gpt/completions"
    assert (span.attributes["http.response.status_code"], span.attributes["slipstream.outcome"]) == (200, "ok")
    [sent] = httpx.get(f"{upstream.url}/_emulator/requests").json()["requests"]
    assert sent["headers"]["traceparent"] == f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-01"


def _values(spans: list[ReadableSpan]) -> str:
    texts = [f"{key}={value}" for s in spans for key, value in s.attributes.items()]
    texts += [f"{key}={value}" for s in spans for event in s.events for key, value in event.attributes.items()]
    return "\n".join(texts)


def _every_kind_of_request(proxy) -> None:
    claude = _claude(proxy)
    claude.messages.create(model="claude-x", max_tokens=16, messages=[{"role": "user", "content": PROMPT}])
    with claude.messages.stream(model="claude-x", max_tokens=16, messages=[{"role": "user", "content": PROMPT + "!"}]) as stream:
        stream.get_final_message()
    gpt = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=TEAM_KEY, max_retries=0)
    gpt.responses.create(model="claude-x", input=PROMPT, max_output_tokens=16, store=False)
    gpt.completions.create(model="gpt-3.5-turbo-instruct", prompt=PROMPT, max_tokens=8)


def test_no_key_or_prompt_in_any_attribute_without_the_opt_in(traced, exporter, monkeypatch):
    _, proxy = traced
    _every_kind_of_request(proxy)
    _request_spans(exporter, 4)
    seen = _values(list(exporter.get_finished_spans())).lower()
    for secret in (TEAM_KEY, *UPSTREAM_KEYS, "marmalade", "authorization", "bearer", "x-api-key"):
        assert secret not in seen

    monkeypatch.setenv(tracing.CAPTURE_VAR, "true")
    processor = SimpleSpanProcessor(exporter)
    tracing.install(processor)  # the opt-in is read when tracing is set up
    try:
        exporter.clear()
        _claude(proxy).messages.create(model="claude-x", max_tokens=16, messages=[{"role": "user", "content": PROMPT}])
        [span] = _request_spans(exporter)
        assert "marmalade" in span.attributes["gen_ai.input.messages"]
        assert "gen_ai.output.messages" in span.attributes
        seen = _values(list(exporter.get_finished_spans()))
        assert TEAM_KEY not in seen and not any(key in seen for key in UPSTREAM_KEYS)
    finally:
        monkeypatch.delenv(tracing.CAPTURE_VAR)
        tracing.install(processor)


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


def test_what_a_client_sends_is_held_in_a_trace_within_bounds(traced, exporter, monkeypatch):
    """Finished traces wait in the serving process for the export child (up to 40,000 of them, every
    team's), and what they held was cut only in that child: with message capture on, each held its
    request's whole messages (a body may be 32 MiB), and any trace held the client's whole
    `tracestate` header (up to 64 KiB), which was also sent upstream; one team's large requests
    filled the memory every team's requests share while the collector lagged. Captured values are cut
    at the attribute length limit where they are recorded, and a tracestate over 512 characters is
    dropped (W3C asks vendors to carry 512)."""
    from sdk.observability.tracing.otlp_encoding import VALUE_LIMIT

    upstream, proxy = traced
    monkeypatch.setenv(tracing.CAPTURE_VAR, "true")
    processor = SimpleSpanProcessor(exporter)
    tracing.install(processor)  # the opt-in is read when tracing is set up
    try:
        exporter.clear()
        tracestate = ",".join(f"v{i}=" + "a" * 200 for i in range(20))
        response = httpx.post(
            f"{proxy.url}/v1/chat/completions",
            headers={"authorization": f"Bearer {TEAM_KEY}", "tracestate": tracestate,
                     "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
            json={"model": "gpt-4o", "messages": [{"role": "user", "content": "word " * 60_000}]}, timeout=PATIENCE_S)
        assert response.status_code == 200
        [span] = _request_spans(exporter)
        assert len(span.attributes["gen_ai.input.messages"]) == VALUE_LIMIT  # before: all 300,000 characters and more
    finally:
        monkeypatch.delenv(tracing.CAPTURE_VAR)
        tracing.install(processor)
    [sent] = httpx.get(f"{upstream.url}/_emulator/requests").json()["requests"]
    assert "tracestate" not in sent["headers"]  # before: its 4 KiB went upstream


def test_a_teams_invented_model_names_do_not_multiply_the_genai_metrics(traced, reader):
    """The OpenTelemetry metrics' `gen_ai.request.model` and `gen_ai.response.model` were the model names
    as sent: a team on a wildcard route made a series per name it invented, in the SDK that keeps every
    series and, past 2,000 an instrument, records every later one (any team's) as one overflow point
    without its team. They follow the Prometheus labels now: the policy's names, and the first 32
    other names of a team, then `other`."""
    _, proxy = traced
    client = _claude(proxy)
    for i in range(40):
        client.messages.create(model=f"claude-invented-{i}", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    models = {p.attributes["gen_ai.request.model"] for p in _points(reader)["gen_ai.client.operation.duration"]
              if p.attributes.get("slipstream.team") == "routing"}
    invented = {m for m in models if m.startswith("claude-invented-")}
    assert len(invented) < 32 and "other" in models  # before: all 40
