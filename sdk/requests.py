"""What both doors do to a client's request before the pipeline: parse and check it.

The proxy (gateway/proxy.py) and the drop-in SDK (sdk/dropin.py) both call these, so a request
is accepted or refused the same way whichever door it came through.
"""

from __future__ import annotations

import orjson

from sdk.errors import InvalidRequestError
from sdk.types import Endpoint, LLMRequest

# Client headers the pipeline acts on; never auth. The provider ones travel upstream, Slipstream's
# own (a request raising its semantic-cache precision) stop at the gateway: see `upstream_headers`.
FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta", "x-slipstream-min-precision")


def upstream_headers(request: LLMRequest) -> dict[str, str]:
    """The client headers a provider should see."""
    return {k: v for k, v in request.forward_headers.items() if not k.startswith("x-slipstream-")}


def parse_request(endpoint: Endpoint, raw: bytes, query: str, forward: dict[str, str]) -> LLMRequest:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("model: a non-empty string is required")
    if endpoint is Endpoint.EMBEDDINGS:
        _check_embedding_input(body.get("input"))
    elif endpoint in (Endpoint.RESPONSES, Endpoint.RESPONSES_INPUT_TOKENS):
        if not isinstance(body.get("input", ""), (str, list)):
            raise InvalidRequestError("input: a string or a list of input items is required")
    elif not isinstance(body.get("messages"), list):
        raise InvalidRequestError("messages: a list of messages is required")
    return LLMRequest(endpoint, body, forward, query)


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

