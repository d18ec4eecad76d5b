"""Span attributes after the OpenTelemetry GenAI semantic conventions, from Slipstream's own objects.

Names, counts and times only: never a key or a header; prompt and answer text only with
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true` (the conventions' opt-in).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import orjson

from sdk.observability.tracing.otlp_encoding import VALUE_LIMIT
from sdk.types import Answer, Endpoint, LLMResponse, LLMStream, Usage

if TYPE_CHECKING:
    from sdk.pipeline import RequestContext

CAPTURE_VAR = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_OPERATIONS = {
    Endpoint.MESSAGES: "chat",
    Endpoint.CHAT_COMPLETIONS: "chat",
    Endpoint.RESPONSES: "chat",
    Endpoint.EMBEDDINGS: "embeddings",
    Endpoint.COUNT_TOKENS: "count_tokens",
    Endpoint.RESPONSES_INPUT_TOKENS: "count_tokens",
    Endpoint.RESPONSES_COMPACT: "chat",
}
_REQUEST_SETTINGS = (("max_tokens", "gen_ai.request.max_tokens"), ("max_completion_tokens", "gen_ai.request.max_tokens"),
                     ("max_output_tokens", "gen_ai.request.max_tokens"), ("temperature", "gen_ai.request.temperature"),
                     ("top_p", "gen_ai.request.top_p"))
# Read from a complete body without parsing it: in JSON a quote inside a string is escaped, so these
# key patterns only match real keys (the first `"model"`/`"id"` is the top-level one in every shape).
_REASON = re.compile(rb'"(?:finish_reason|stop_reason)":"([^"\\]{1,64})"')
_MODEL = re.compile(rb'"model":"([^"\\]{1,200})"')
_ID = re.compile(rb'"id":"([^"\\]{1,200})"')
_RESPONSES_STATUS = re.compile(rb'"object":"response".{0,200}?"status":"([a-z_]{1,32})"', re.S)


def operation(endpoint: Endpoint) -> str:
    """The GenAI `gen_ai.operation.name` of an endpoint."""
    return _OPERATIONS.get(endpoint, str(endpoint))


def provider_name(provider: object) -> str:
    """The GenAI `gen_ai.provider.name` of an adapter: its own `gen_ai_provider`, else its wire protocol."""
    name = getattr(provider, "gen_ai_provider", None)
    return name if isinstance(name, str) else str(getattr(provider, "protocol", "unknown"))


def error_type(error: BaseException) -> str:
    """`error.type`: the error's class, with its HTTP status when it has one (`UpstreamHTTPError:500`)."""
    status = getattr(error, "status", None)
    name = type(error).__name__
    return f"{name}:{status}" if isinstance(status, int) else name


def request_attributes(ctx: RequestContext, name: str, capture: bool) -> dict[str, Any]:
    """What is known when the request starts."""
    request = ctx.request
    body = request.body
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": name,
        "gen_ai.request.model": request.model,
        "slipstream.team": ctx.team,
        "slipstream.endpoint": request.endpoint.value,
        "slipstream.request_id": ctx.request_id,
        "slipstream.stream": request.stream,
    }
    for field, attribute in _REQUEST_SETTINGS:
        value = body.get(field)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attributes[attribute] = value
    if capture:  # cut where recorded: a finished trace waits in the serving process for the export child
        messages = body.get("messages", body.get("input"))
        if messages is not None:
            attributes["gen_ai.input.messages"] = orjson.dumps(messages).decode()[:VALUE_LIMIT]
        system = body.get("system", body.get("instructions"))
        if system is not None:
            attributes["gen_ai.system_instructions"] = orjson.dumps(system).decode()[:VALUE_LIMIT]
    return attributes


def result_attributes(ctx: RequestContext, status: int | str, answer: Answer | None, capture: bool) -> dict[str, Any]:
    """What is known when it ends: route, cache, attempts, usage, the answering model and finish reasons."""
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
    if isinstance(answer, LLMResponse):
        _read_body(attributes, answer.body, capture)
    elif isinstance(answer, LLMStream) and answer.finish_reasons:
        attributes["gen_ai.response.finish_reasons"] = tuple(answer.finish_reasons)
    return attributes


def _read_body(attributes: dict[str, Any], body: bytes, capture: bool) -> None:
    """Finish reasons, response id and model of a complete body (both dialects and Responses)."""
    if (found := _MODEL.search(body)) is not None:
        attributes["gen_ai.response.model"] = found.group(1).decode()
    if (found := _ID.search(body)) is not None:
        attributes["gen_ai.response.id"] = found.group(1).decode()
    reasons = [reason.decode() for reason in _REASON.findall(body)]
    if not reasons and (found := _RESPONSES_STATUS.search(body)) is not None:
        reasons.append(found.group(1).decode())
    if reasons:
        attributes["gen_ai.response.finish_reasons"] = tuple(reasons)
    if capture:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return
        output = (data.get("choices") or data.get("content") or data.get("output")) if isinstance(data, dict) else None
        if output is not None:
            attributes["gen_ai.output.messages"] = orjson.dumps(output).decode()[:VALUE_LIMIT]
