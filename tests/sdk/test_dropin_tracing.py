"""The drop-in SDK traces in process like the proxy: the same spans, under the application's own span."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.helpers import PATIENCE_S, skip_without_extra

skip_without_extra("otel")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

import sdk  # noqa: E402
from sdk.observability import tracing  # noqa: E402


@pytest.fixture
def caught() -> Iterator[tuple[InMemorySpanExporter, object]]:
    """One exporter for Slipstream's spans and the application's own tracer (its own provider)."""
    exporter = InMemorySpanExporter()
    tracing.install(SimpleSpanProcessor(exporter))
    app = TracerProvider()
    app.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter, app.get_tracer("the-application")
    tracing.reset()


def _under(exporter: InMemorySpanExporter, parent: ReadableSpan, count: int = 1) -> list[ReadableSpan]:
    """The spans whose parent is `parent`, once `count` have ended (a stream's ends after the last read)."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        found = [s for s in exporter.get_finished_spans() if s.parent is not None and s.parent.span_id == parent.context.span_id]
        if len(found) >= count or time.monotonic() > deadline:
            return sorted(found, key=lambda s: s.start_time)
        time.sleep(0.01)


def test_a_sync_client_call_is_a_child_of_the_applications_span(policy, emu, caught):
    exporter, tracer = caught
    client = sdk.OpenAI(policy=policy, max_retries=0)
    with tracer.start_as_current_span("handle order") as app_span:
        reply = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    app = next(s for s in exporter.get_finished_spans() if s.name == "handle order")
    [request] = _under(exporter, app)  # the pipeline ran on the SDK's loop thread, still under the caller's span
    assert request.name == "chat gpt-4o" and request.context.trace_id == app_span.get_span_context().trace_id
    assert request.attributes["gen_ai.response.finish_reasons"] == (reply.choices[0].finish_reason,)
    [attempt] = _under(exporter, request)
    assert attempt.attributes["slipstream.outcome"] == "ok"
    [sent] = httpx.get(f"{emu.url}/_emulator/requests").json()["requests"]
    flags = int(app_span.get_span_context().trace_flags)  # the application's flags travel on
    assert sent["headers"]["traceparent"] == f"00-{request.context.trace_id:032x}-{attempt.context.span_id:016x}-{flags:02x}"


async def test_an_async_stream_is_traced_with_finish_reasons_under_the_applications_span(policy, emu, caught):
    exporter, tracer = caught
    client = sdk.AsyncAnthropic(policy=policy, max_retries=0)
    with tracer.start_as_current_span("summarize"):
        async with client.messages.stream(model="claude-x", max_tokens=32, messages=[{"role": "user", "content": "hi"}]) as stream:
            final = await stream.get_final_message()
    await asyncio.sleep(0)  # spans are handed over when the loop is next free, after the answer
    app = next(s for s in exporter.get_finished_spans() if s.name == "summarize")
    [request] = _under(exporter, app)
    assert request.attributes["slipstream.stream"] is True
    assert request.attributes["gen_ai.response.finish_reasons"] == (final.stop_reason,)
    assert [event.name for event in request.events] == ["gen_ai.first_token"]
    assert [s.name for s in _under(exporter, request)] == ["attempt claude/claude-x"]
