"""Turn a finished request's records into OpenTelemetry spans and hand them to the span processor.

Built here as finished `ReadableSpan`s, each handed to the processor's `on_end` (a
`BatchSpanProcessor` in production, whose worker thread exports them over OTLP). The SDK's own
`Tracer.start_span(...).end()` path costs about ten times more per span (locks, attribute
validation, the sampler, context lookups; measured in bench/tracing_overhead.py), which would make
per-stage spans unaffordable. What that path would add is done once per request instead: the
sampler decides at the request's start (sdk/observability/tracing/__init__.py), attribute values are of the
types the conventions allow because they are built here, and processors' `on_start` is not called
(Slipstream's spans are only ever handed over finished).
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from sdk.observability.tracing.records import Parent, RequestTrace, SpanRecord

_SCOPE = InstrumentationScope("slipstream")
_OK = Status(StatusCode.UNSET)


class Sink:
    """Where finished requests' spans go: one span processor and the service's resource."""

    def __init__(self, processor: SpanProcessor, resource: Any):
        self.processor = processor
        self.resource = resource

    def emit(self, trace: RequestTrace) -> None:
        parent = trace.parent
        flags = TraceFlags(trace.flags)
        state = TraceState.from_header([parent.tracestate]) if parent is not None and parent.tracestate else None
        root = trace.root
        root_context = SpanContext(trace.trace_id, root.span_id, False, flags, state)
        on_end = self.processor.on_end
        for record in trace.children:
            if not record.end_ns:  # still open when the request ended (cannot happen today): ends with it
                record.end_ns = root.end_ns
            on_end(self._span(record, SpanContext(trace.trace_id, record.span_id, False, flags, state), root_context))
        up = None if parent is None else SpanContext(parent.trace_id, parent.span_id, parent.remote, flags, state)
        on_end(self._span(root, root_context, up))

    def _span(self, record: SpanRecord, context: SpanContext, parent: SpanContext | None) -> ReadableSpan:
        events = tuple(Event(name, attributes, at) for name, at, attributes in record.events)
        return ReadableSpan(
            record.name, context, parent, self.resource, record.attributes, events, (),
            SpanKind.CLIENT if record.client else SpanKind.INTERNAL, None,
            Status(StatusCode.ERROR, record.error) if record.error else _OK,
            record.start_ns, record.end_ns, _SCOPE,
        )

    def shutdown(self) -> None:
        self.processor.shutdown()


def sampled(sampler: Any, parent: Parent | None, trace_id: int, name: str, attributes: dict[str, Any]) -> bool:
    """The configured sampler's decision for a request's span (`OTEL_TRACES_SAMPLER`); its attributes join the span's."""
    context = None
    if parent is not None:
        state = TraceState.from_header([parent.tracestate]) if parent.tracestate else None
        remote = SpanContext(parent.trace_id, parent.span_id, parent.remote, TraceFlags(parent.flags), state)
        context = set_span_in_context(NonRecordingSpan(remote))
    result = sampler.should_sample(context, trace_id, name, SpanKind.INTERNAL, attributes)
    if result.attributes:
        attributes.update(result.attributes)
    sampled: bool = result.decision.is_sampled()  # opentelemetry leaves is_sampled unannotated
    return sampled
