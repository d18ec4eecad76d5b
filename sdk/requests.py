"""What both doors do to a client's request before the pipeline: parse and check it.

The proxy (gateway/proxy.py) and the drop-in SDK (sdk/dropin.py) both call these, so a request
is accepted or refused the same way whichever door it came through.
"""

from __future__ import annotations

from typing import Any

import orjson

from sdk.errors import InvalidParameterError, InvalidRequestError
from sdk.offload import is_large, off_loop
from sdk.types import Endpoint, LLMRequest

# Client headers the pipeline acts on; never auth. The provider ones travel upstream, Slipstream's
# own (a request raising its semantic-cache precision) stop at the gateway: see `upstream_headers`.
# W3C trace context travels too: tracing makes the request's span its child and sends its own
# upstream (sdk/observability/tracing/); with tracing off the client's passes through unchanged.
FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta", "x-slipstream-min-precision", "traceparent", "tracestate")


def upstream_headers(request: LLMRequest) -> dict[str, str]:
    """The client headers a provider should see."""
    return {k: v for k, v in request.forward_headers.items() if not k.startswith("x-slipstream-")}


# What the pipeline relies on, checked at the door; everything else passes through untouched and
# is the provider's to judge. Depth: orjson writes at most 255 levels and the stages recurse once
# or twice per level, so a deeper body would fail inside the pipeline, after work was paid for.
MAX_JSON_DEPTH = 64
MAX_MODEL_CHARS = 256
MAX_CHOICES = 128  # Chat Completions `n`, OpenAI's range 1..128: a Claude target answers it with n requests (fanout.py)


def parse_request(endpoint: Endpoint, raw: bytes, query: str, forward: dict[str, str]) -> LLMRequest:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("request body must be a JSON object")
    check_depth(raw, body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("model: a non-empty string is required")
    check_model_name(model)
    if endpoint is Endpoint.EMBEDDINGS:
        _check_embedding_input(body.get("input"))
    elif endpoint in (Endpoint.RESPONSES, Endpoint.RESPONSES_INPUT_TOKENS, Endpoint.RESPONSES_COMPACT):
        if not isinstance(body.get("input", ""), (str, list)):
            raise InvalidRequestError("input: a string or a list of input items is required")
    elif not isinstance(body.get("messages"), list):
        raise InvalidRequestError("messages: a list of messages is required")
    if endpoint is Endpoint.CHAT_COMPLETIONS:
        check_choices(body.get("n"))
    return LLMRequest(endpoint, body, forward, query, size=len(raw))


async def parse_off_loop(endpoint: Endpoint, raw: bytes, query: str, forward: dict[str, str]) -> LLMRequest:
    """`parse_request`, in the heavy-work pool when the body is large (sdk/offload.py)."""
    if is_large(len(raw)):
        return await off_loop(parse_request, endpoint, raw, query, forward)
    return parse_request(endpoint, raw, query, forward)


def check_model_name(model: str) -> None:
    """Model names travel in response headers and metric labels: printable ASCII, bounded."""
    if len(model) > MAX_MODEL_CHARS:
        raise InvalidRequestError(f"model: at most {MAX_MODEL_CHARS} characters")
    if not model.isascii() or not model.isprintable():
        raise InvalidRequestError("model: only printable ASCII characters (no control characters)")


def check_choices(n: object) -> None:
    """Chat Completions `n` within OpenAI's range, refused in OpenAI's words: the limits stage admits
    and holds a request by its choices, and a Claude target is sent one request per choice."""
    if n is None:
        return
    if not isinstance(n, int) or isinstance(n, bool):
        raise InvalidParameterError(f"Invalid type for 'n': expected an integer, but got {type(n).__name__} instead.", "n", "invalid_type")
    if n < 1:
        raise InvalidParameterError(f"Invalid 'n': integer below minimum value. Expected a value >= 1, but got {n} instead.",
                                    "n", "integer_below_min_value")
    if n > MAX_CHOICES:
        raise InvalidParameterError(f"Invalid 'n': integer above maximum value. Expected a value <= {MAX_CHOICES}, but got {n} "
                                    "instead.", "n", "integer_above_max_value")


def check_depth(raw: bytes, body: Any) -> None:
    """Refuse JSON nested deeper than MAX_JSON_DEPTH (counted in containers)."""
    if len(raw) < 65536 and raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return  # cannot be deeper than the containers it opens; a large body is walked instead (no extra passes)
    level: list[Any] = [body]
    depth = 0
    while level:
        depth += 1
        if depth > MAX_JSON_DEPTH:
            raise InvalidRequestError(f"request body is nested deeper than {MAX_JSON_DEPTH} levels")
        nested: list[Any] = []
        for value in level:
            children = value.values() if isinstance(value, dict) else value
            nested.extend(child for child in children if isinstance(child, (dict, list)))
        level = nested


def _check_embedding_input(value: object) -> None:
    """OpenAI's four input shapes: a string, a list of strings, a token list, a list of token lists."""
    if isinstance(value, str) and value:
        return
    if isinstance(value, list) and value:
        if all(isinstance(item, str) and item for item in value):
            return
        if all(isinstance(item, int) for item in value):
            return
        if all(isinstance(item, list) and item and all(isinstance(t, int) for t in item) for item in value):
            return
    raise InvalidRequestError(
        "input: a non-empty string, a list of non-empty strings, a list of token ids, or a list of token-id lists is required"
    )

