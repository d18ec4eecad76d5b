"""OpenTelemetry traces: one span per request with the GenAI semantic conventions, a child per upstream attempt.

Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set: then the
first request sets up a TracerProvider with a BatchSpanProcessor and the OTLP HTTP/protobuf
exporter; the SDK itself reads the other standard `OTEL_*` variables (service name, headers,
sampler, batch sizes). OpenTelemetry is the `[otel]` extra and is imported only then. When off, a
request pays one call that reads a module global (`begin` returns None) and nothing else.

The metrics stage opens the request span (it sees every request start and end) and closes it when
the answer is complete or the stream ends; the router opens one CLIENT span per upstream attempt,
up to its first byte, and sends that span's W3C `traceparent` upstream. An incoming `traceparent`
(both doors pass it in `forward_headers`) makes the request span its child.

Attributes carry names, counts and times, never keys; prompt and response text only with
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from typing import TYPE_CHECKING, Any

import orjson

from sdk.types import Answer, Endpoint, LLMRequest, LLMResponse, Usage

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from sdk.pipeline import RequestContext

log = logging.getLogger("slipstream.tracing")

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
CAPTURE_VAR = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_OPERATIONS = {
    Endpoint.MESSAGES: "chat",
    Endpoint.CHAT_COMPLETIONS: "chat",
    Endpoint.RESPONSES: "chat",
    Endpoint.EMBEDDINGS: "embeddings",
    Endpoint.COUNT_TOKENS: "count_tokens",
    Endpoint.RESPONSES_INPUT_TOKENS: "count_tokens",
}
_REQUEST_SETTINGS = (("max_tokens", "gen_ai.request.max_tokens"), ("max_completion_tokens", "gen_ai.request.max_tokens"),
                     ("max_output_tokens", "gen_ai.request.max_tokens"), ("temperature", "gen_ai.request.temperature"),
                     ("top_p", "gen_ai.request.top_p"))
_MAX_PARSED_BODY = 1 << 20  # finish reasons are read from bodies up to this size only

_tracer: Tracer | None = None
_decided = False  # whether the environment has been read (once per process, at the first request)
_capture = False


def install(provider: TracerProvider | None) -> None:
    """Trace with `provider` (tests, benchmarks, an application's own provider); None turns tracing off."""
    global _tracer, _decided, _capture
    _tracer = provider.get_tracer("slipstream") if provider is not None else None
    _capture = os.environ.get(CAPTURE_VAR, "").lower() == "true"
    _decided = True


def reset() -> None:
    """Forget the decision: the next request reads the environment again."""
    global _tracer, _decided
    _tracer, _decided = None, False


def otlp_wanted(variables: tuple[str, ...], exporter_module: str, what: str) -> bool:
    """Whether one of `variables` names an OTLP endpoint and the `[otel]` extra is there (else one warning)."""
    if not any(os.environ.get(name) for name in variables):
        return False
    try:
        importlib.import_module(exporter_module)
    except ImportError as exc:
        log.warning("an OTLP endpoint is set but OpenTelemetry is not installed (%s): %s off; "
                    "install the extra with pip install 'slipstream[otel]'", exc, what)
        return False
    return True


def resource() -> Any:
    """The service's OpenTelemetry resource: `OTEL_SERVICE_NAME`, `slipstream` by default."""
    from opentelemetry.sdk.resources import Resource

    return Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "slipstream")})


def _from_environment() -> None:
    if not otlp_wanted(ENDPOINT_VARS, "opentelemetry.exporter.otlp.proto.http.trace_exporter", "tracing is"):
        install(None)
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=resource())
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    install(provider)


def begin(ctx: RequestContext) -> Span | None:
    """The request's span, or None when tracing is off (the one check a request pays)."""
    if not _decided:
        _from_environment()
    if _tracer is None:
        return None
    from opentelemetry.trace import SpanKind

    request = ctx.request
    name = operation(request.endpoint)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": name,
        "gen_ai.request.model": request.model,
        "slipstream.team": ctx.team,
        "slipstream.endpoint": str(request.endpoint),
        "slipstream.request_id": ctx.request_id,
        "slipstream.stream": request.stream,
    }
    body = request.body
    for field, attribute in _REQUEST_SETTINGS:
        value = body.get(field)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attributes[attribute] = value
    if _capture:
        _capture_input(attributes, body)
    span = _tracer.start_span(f"{name} {request.model}", context=_incoming(request), kind=SpanKind.INTERNAL,
                              attributes=attributes)
    ctx.span = span
    return span


def end(ctx: RequestContext, status: int | str, answer: Answer | None = None, error: BaseException | None = None) -> None:
    """Close the request's span (a no-op when it has none) with what the answer or the error says."""
    span = ctx.span
    if span is None:
        return
    from opentelemetry.trace import StatusCode

    route = (answer.route if answer is not None else "") or ctx.route
    usage = answer.usage if answer is not None else Usage()
    attributes: dict[str, Any] = {
        "slipstream.route": route,
        "slipstream.cache": ctx.cache_status,
        "slipstream.attempts": ctx.attempts,
        "slipstream.status": str(status),
        "gen_ai.usage.input_tokens": usage.total_input_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": usage.cache_read_tokens,
        "gen_ai.usage.cache_creation.input_tokens": usage.cache_write_tokens,
        "slipstream.prompt_cache.expected_read": ctx.prompt_cache.expected_read,
    }
    if isinstance(status, int):
        attributes["http.response.status_code"] = status
    if ctx.provider:
        attributes["gen_ai.provider.name"] = ctx.provider
    if "/" in route:
        attributes["gen_ai.response.model"] = route.split("/", 1)[1]
    if isinstance(answer, LLMResponse) and len(answer.body) <= _MAX_PARSED_BODY:
        _read_response(attributes, answer.body)
    span.set_attributes(attributes)
    first = ctx.timings.first_token
    if first is not None:
        ttft_ms = (first - ctx.timings.start) * 1000
        at = time.time_ns() - int((time.perf_counter() - first) * 1e9)
        span.add_event("gen_ai.first_token", {"slipstream.ttft_ms": round(ttft_ms, 3)}, timestamp=at)
    if error is not None:
        span.set_attribute("error.type", error_type(error))
        span.set_status(StatusCode.ERROR, str(error)[:200])
    elif status == "stream_error":
        span.set_attribute("error.type", "stream_error")
        span.set_status(StatusCode.ERROR, "the stream ended with an error event")
    span.end()
    ctx.span = None


def operation(endpoint: Endpoint) -> str:
    """The GenAI `gen_ai.operation.name` of an endpoint."""
    return _OPERATIONS.get(endpoint, str(endpoint))


def provider_name(provider: object) -> str:
    """The GenAI `gen_ai.provider.name` of an adapter: its own `gen_ai_provider`, else its wire protocol."""
    name = getattr(provider, "gen_ai_provider", None)
    return name if isinstance(name, str) else str(getattr(provider, "protocol", "unknown"))


def begin_attempt(ctx: RequestContext, key: str, provider: object, request: LLMRequest) -> tuple[Span | None, LLMRequest]:
    """A child span for one upstream attempt and the request carrying its `traceparent`; (None, request) untraced."""
    if ctx.span is None or _tracer is None:  # untraced, or tracing turned off while the request ran
        return None, request
    from opentelemetry.trace import SpanKind, set_span_in_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    span = _tracer.start_span(
        f"attempt {key}", context=set_span_in_context(ctx.span), kind=SpanKind.CLIENT,
        attributes={"slipstream.target": key, "slipstream.attempt": ctx.attempts,
                    "gen_ai.provider.name": provider_name(provider), "gen_ai.request.model": request.model,
                    "gen_ai.operation.name": operation(request.endpoint)},
    )
    headers = {k: v for k, v in request.forward_headers.items() if k not in ("traceparent", "tracestate")}
    TraceContextTextMapPropagator().inject(headers, context=set_span_in_context(span))
    return span, LLMRequest(request.endpoint, request.body, headers, request.query, request.size)


def end_attempt(span: Span | None, outcome: str, error: BaseException | None = None) -> None:
    """Close an attempt's span: `ok`, `failed` (with the error's type) or `cancelled`."""
    if span is None:
        return
    span.set_attribute("slipstream.outcome", outcome)
    if error is not None:
        from opentelemetry.trace import StatusCode

        span.set_attribute("error.type", error_type(error))
        span.set_status(StatusCode.ERROR, str(error)[:200])
    span.end()


def _incoming(request: LLMRequest) -> Any:
    """The client's trace context from its `traceparent`, or None (a new trace)."""
    if "traceparent" not in request.forward_headers:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(request.forward_headers)


def error_type(error: BaseException) -> str:
    """`error.type`: the error's class, with its HTTP status when it has one (`UpstreamHTTPError:500`)."""
    status = getattr(error, "status", None)
    name = type(error).__name__
    return f"{name}:{status}" if isinstance(status, int) else name


def _read_response(attributes: dict[str, Any], body: bytes) -> None:
    """Finish reasons and the answering model from a complete body (both dialects and Responses)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    if not isinstance(data, dict):
        return
    if isinstance(data.get("model"), str):
        attributes["gen_ai.response.model"] = data["model"]
    if isinstance(data.get("id"), str):
        attributes["gen_ai.response.id"] = data["id"]
    reasons = [c.get("finish_reason") for c in data.get("choices") or () if isinstance(c, dict)]
    if isinstance(data.get("stop_reason"), str):
        reasons.append(data["stop_reason"])
    if isinstance(data.get("status"), str) and data.get("object") == "response":
        reasons.append(data["status"])
    reasons = [r for r in reasons if isinstance(r, str)]
    if reasons:
        attributes["gen_ai.response.finish_reasons"] = reasons
    if _capture:
        output = data.get("choices") or data.get("content") or data.get("output")
        if output is not None:
            attributes["gen_ai.output.messages"] = orjson.dumps(output).decode()


def _capture_input(attributes: dict[str, Any], body: dict[str, Any]) -> None:
    """Prompt text, only with the opt-in: the messages (or Responses input) and the system instructions."""
    messages = body.get("messages", body.get("input"))
    if messages is not None:
        attributes["gen_ai.input.messages"] = orjson.dumps(messages).decode()
    system = body.get("system", body.get("instructions"))
    if system is not None:
        attributes["gen_ai.system_instructions"] = orjson.dumps(system).decode()
