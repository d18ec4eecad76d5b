"""OpenTelemetry traces: one span per request with the GenAI semantic conventions, a child per stage
that did work and per upstream attempt.

Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set: then the
first request sets up a BatchSpanProcessor with the OTLP HTTP/protobuf exporter (sdk/observability/tracing/setup.py;
the SDK reads the other standard `OTEL_*` variables). OpenTelemetry is the `[otel]` extra and is
imported only then. When off, `begin` reads two module globals and returns None; every other hook
sees `ctx.trace is None` and does nothing, and no OpenTelemetry code runs at all.

The metrics stage opens the request's trace (it sees every request start and end) and closes it
when the answer is complete or the stream ends; stages add a child for their own work
(`ctx.trace.stage(...)`), the router one CLIENT child per upstream attempt, up to its first byte,
and sends that child's W3C `traceparent` upstream. An incoming `traceparent` (both doors pass it in
`forward_headers`) makes the request's span its child; in the drop-in SDK the application's
current span does (`caller_parent`). Pass-through requests are traced by `begin_passthrough`.

While a request runs, its spans are plain records (sdk/observability/tracing/records.py); they become
OpenTelemetry spans in one pass when it ends (sdk/observability/tracing/emit.py), which is what makes a span per
stage cheap enough (docs/observability.md, "Cost").
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from sdk.observability.tracing.genai import (
    CAPTURE_VAR,
    error_type,
    operation,
    provider_name,
    request_attributes,
    result_attributes,
)
from sdk.observability.tracing.records import Parent, RequestTrace, SpanRecord, new_span_id, new_trace_id, parse_traceparent
from sdk.observability.tracing.setup import ENDPOINT_VARS, otlp_wanted, resource
from sdk.offload import HEAVY_POOL, is_large
from sdk.types import Answer, LLMRequest, LLMResponse

if TYPE_CHECKING:
    from sdk.observability.tracing.emit import Sink
    from sdk.observability.tracing.export_process import ProcessSink
    from sdk.pipeline import RequestContext

__all__ = [
    "CAPTURE_VAR", "ENDPOINT_VARS", "Parent", "RequestTrace", "SpanRecord", "begin", "begin_attempt",
    "begin_passthrough", "caller_parent", "end", "end_attempt", "end_passthrough", "error_type", "install",
    "operation", "otlp_wanted", "provider_name", "reset", "resource", "use_sink",
]

_sink: Sink | ProcessSink | None = None
_sampler: Any = None  # None: parent-based always-on, decided without a call
_decided = False  # whether the environment has been read (once per process, at the first request)
_capture = False
_TRACE_HEADERS = ("traceparent", "tracestate")


def install(processor: Any, sampler: Any = None, service: Any = None) -> None:
    """Trace into `processor` (an OpenTelemetry SpanProcessor: tests, benchmarks, an application's own
    exporter); None turns tracing off. `sampler` (an SDK Sampler) decides per request when given;
    `service` is the resource (else `OTEL_SERVICE_NAME`, `slipstream` by default)."""
    sink = None
    if processor is not None:
        from sdk.observability.tracing.emit import Sink

        sink = Sink(processor, service if service is not None else resource())
    use_sink(sink, sampler)


def use_sink(sink: Sink | ProcessSink | None, sampler: Any = None) -> None:
    """Hand finished request traces to `sink` (anything with `emit(RequestTrace)`; None: off)."""
    global _sink, _sampler, _decided, _capture
    _sink, _sampler = sink, sampler
    _capture = os.environ.get(CAPTURE_VAR, "").lower() == "true"
    _decided = True


def reset() -> None:
    """Forget the decision: the next request reads the environment again."""
    global _sink, _sampler, _decided
    _sink, _sampler, _decided = None, None, False


def _decide() -> None:
    from sdk.observability.tracing.setup import from_environment

    found = from_environment()
    use_sink(*(found or (None, None)))


def enabled() -> bool:
    if not _decided:
        _decide()
    return _sink is not None


def caller_parent() -> Parent | None:
    """The application's current span, for the drop-in SDK (its request span goes under it); None when
    tracing is off or no span is current. Sync clients call this on the caller's thread."""
    if not enabled():
        return None
    from opentelemetry.trace import get_current_span

    span = get_current_span().get_span_context()
    if not span.is_valid:
        return None
    state = span.trace_state.to_header() if span.trace_state else ""
    return Parent(span.trace_id, span.span_id, int(span.trace_flags), state, span.is_remote)


def _parent(headers: dict[str, str], caller: Parent | None) -> Parent | None:
    value = headers.get("traceparent")
    if value is not None:
        return parse_traceparent(value, headers.get("tracestate", ""))
    return caller


def _start(name: str, attributes: dict[str, Any], parent: Parent | None) -> RequestTrace | None:
    """A new request trace, or None when the sampler (or an unsampled parent) says no."""
    trace_id = parent.trace_id if parent is not None else new_trace_id()
    if _sampler is not None:
        from sdk.observability.tracing.emit import sampled

        if not sampled(_sampler, parent, trace_id, name, attributes):
            return None
    elif parent is not None and not parent.flags & 1:
        return None  # parent-based: the caller chose not to record this trace
    return RequestTrace(trace_id, SpanRecord(name, new_span_id(), time.time_ns(), attributes), parent)


def begin(ctx: RequestContext) -> RequestTrace | None:
    """The request's trace, or None when tracing is off (the one check a request pays)."""
    if not _decided:
        _decide()
    if _sink is None:
        return None
    request = ctx.request
    name = operation(request.endpoint)
    attributes = request_attributes(ctx, name, _capture)
    trace = _start(f"{name} {attributes['gen_ai.request.model']}", attributes, _parent(request.forward_headers, ctx.parent))
    ctx.trace = trace
    return trace


def end(ctx: RequestContext, status: int | str, answer: Answer | None = None, error: BaseException | None = None) -> None:
    """Close the request's trace (a no-op when it has none): its end time now; what the answer or the
    error says is read into attributes, and the spans handed to the processor, once the loop is free."""
    trace = ctx.trace
    if trace is None or _sink is None:
        return
    ctx.trace = None
    trace.root.end_ns = now_ns = time.time_ns()
    first = ctx.timings.first_token
    if first is not None:  # the first token's wall-clock time, from its monotonic stamp
        trace.root.events.append(("gen_ai.first_token", now_ns - int((time.perf_counter() - first) * 1e9),
                                  {"slipstream.ttft_ms": round((first - ctx.timings.start) * 1000, 3)}))
    loop = _running_loop()
    if loop is not None and isinstance(answer, LLMResponse) and is_large(len(answer.body)):
        # What a large answer says (an embeddings answer of megabytes for a few words, a long answer with
        # capture on: its finish reasons scanned for, its output parsed) is read in the heavy-work pool as
        # the team's work, not on the loop every team's requests share; the spans go on from the loop.
        sink = _sink
        read = HEAVY_POOL.submit(functools.partial(result_attributes, ctx, status, answer, _capture), tenant=ctx.team)
        read.add_done_callback(lambda done: loop.call_soon_threadsafe(_finish, sink, trace, ctx, status, answer, error, done))
        return
    _hand_over(_finish, _sink, trace, ctx, status, answer, error)


def _finish(sink: Sink | ProcessSink, trace: RequestTrace, ctx: RequestContext, status: int | str, answer: Answer | None,
            error: BaseException | None, read: Future[dict[str, Any]] | None = None) -> None:
    root = trace.root
    root.attributes.update(read.result() if read is not None else result_attributes(ctx, status, answer, _capture))
    if error is not None:
        root.attributes["error.type"] = error_type(error)
        root.error = str(error)[:200] or type(error).__name__
    elif status == "stream_error":
        root.attributes["error.type"] = "stream_error"
        root.error = "the stream ended with an error event"
    sink.emit(trace)


def begin_attempt(ctx: RequestContext, key: str, provider: object, request: LLMRequest,
                  kind: str = "first") -> tuple[SpanRecord | None, LLMRequest]:
    """A child span for one upstream attempt (`kind`: first, retry, fallback or hedge) and the request
    carrying its `traceparent`; (None, request) untraced."""
    trace = ctx.trace
    if trace is None:
        return None, request
    record = trace.child(f"attempt {key}", time.time_ns(), {
        "slipstream.target": key, "slipstream.attempt": ctx.attempts, "slipstream.attempt.kind": kind,
        "gen_ai.provider.name": provider_name(provider), "gen_ai.request.model": request.model,
        "gen_ai.operation.name": operation(request.endpoint),
    }, client=True)
    headers = _with_trace_context(request.forward_headers, trace, record)
    return record, LLMRequest(request.endpoint, request.body, headers, request.query, request.size)


def end_attempt(record: SpanRecord | None, outcome: str, error: BaseException | None = None) -> None:
    """Close an attempt's span: `ok`, `failed` (with the error's type) or `cancelled`."""
    if record is None:
        return
    if error is None:
        record.finish({"slipstream.outcome": outcome})
    else:
        record.finish({"slipstream.outcome": outcome, "error.type": error_type(error)}, str(error)[:200] or type(error).__name__)


def _with_trace_context(headers: dict[str, str], trace: RequestTrace, record: SpanRecord) -> dict[str, str]:
    """`headers` with the client's trace context replaced by the one naming `record`."""
    sent = {k: v for k, v in headers.items() if k.lower() not in _TRACE_HEADERS}
    sent["traceparent"] = trace.traceparent(record)
    if trace.parent is not None and trace.parent.tracestate:
        sent["tracestate"] = trace.parent.tracestate
    return sent


def begin_passthrough(team: str, method: str, family: str, provider: object,
                      headers: dict[str, str], caller: Parent | None = None) -> tuple[RequestTrace | None, dict[str, str]]:
    """The trace of a pass-through request (one span, no pipeline) and the headers to send upstream
    with its `traceparent`; (None, headers) when tracing is off."""
    if not _decided:
        _decide()
    if _sink is None:
        return None, headers
    attributes: dict[str, Any] = {"slipstream.team": team, "slipstream.passthrough": family,
                                  "http.request.method": method, "gen_ai.provider.name": provider_name(provider)}
    if family == "completions":
        attributes["gen_ai.operation.name"] = "text_completion"
    lowered = {k.lower(): v for k, v in headers.items() if k.lower() in _TRACE_HEADERS}
    trace = _start(f"passthrough {family}", attributes, _parent(lowered, caller))
    if trace is None:
        return None, headers
    return trace, _with_trace_context(headers, trace, trace.root)


def end_passthrough(trace: RequestTrace | None, outcome: str, status: int | None = None,
                    error: BaseException | None = None) -> None:
    """Close a pass-through trace (once): `ok` (the answer passed in full), `cancelled` or `failed`."""
    if trace is None or _sink is None or trace.root.end_ns:
        return
    attributes: dict[str, Any] = {"slipstream.outcome": outcome}
    description = ""
    if status is not None:
        attributes["http.response.status_code"] = status
        if status >= 400:
            attributes["error.type"], description = str(status), f"the provider answered {status}"
    if error is not None:
        attributes["error.type"], description = error_type(error), str(error)[:200] or type(error).__name__
    trace.root.finish(attributes, description)
    _hand_over(_sink.emit, trace)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _hand_over(work: Callable[..., None], *args: Any) -> None:
    """Run the rest of a finished trace's work (its result attributes, building the spans, the hand-over
    to the processor) once the event loop is next free: the answer's last bytes go out first (a
    complete answer is returned, a stream's last event sent, before the spans are built), so this
    adds nothing to the request's own latency, only CPU between requests. Outside a loop: now."""
    loop = _running_loop()
    if loop is None:
        work(*args)
        return
    loop.call_soon(work, *args)
