"""What both doors do to a client's request before the pipeline: parse and check it.

The proxy (gateway/proxy.py) and the drop-in SDK (sdk/dropin.py) both call these, so a request
is accepted or refused the same way whichever door it came through.
"""

from __future__ import annotations

import orjson

from sdk.errors import InvalidRequestError
from sdk.types import Endpoint, LLMRequest, Protocol

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
    if not isinstance(body.get("messages"), list):
        raise InvalidRequestError("messages: a list of messages is required")
    return LLMRequest(endpoint, body, forward, query)


def models_body(names: list[str], protocol: Protocol) -> bytes:
    """A `GET /v1/models` answer in the client's provider's shape."""
    if protocol is Protocol.ANTHROPIC:
        data = [{"type": "model", "id": m, "display_name": m, "created_at": "1970-01-01T00:00:00Z"} for m in names]
        first, last = (names[0], names[-1]) if names else (None, None)
        return orjson.dumps({"data": data, "has_more": False, "first_id": first, "last_id": last})
    return orjson.dumps({"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "slipstream"} for m in names]})
