"""What every Anthropic endpoint shares: response headers (B.1, B.6), the error shape (B.5),
authentication with the version header, JSON parsing and the pre-response faults."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from . import streaming
from .asgi import Call, Headers
from .faults import FaultSet
from .paging import limit_of, page

if TYPE_CHECKING:
    from .app import Emulator

ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
    403: "permission_error", 404: "not_found_error", 409: "conflict_error",
    413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 504: "timeout_error",
    529: "overloaded_error",
}
ERROR_MESSAGES = {
    "rate_limit_error": "This request would exceed the rate limit for your organization "
    "(emulator) of 4,000 requests per minute. For details, refer to: "
    "https://docs.claude.com/en/api/rate-limits. You can see the response headers for current "
    "usage. Please reduce the prompt length or the maximum tokens requested, or try again later.",
    "overloaded_error": "Overloaded",
    "api_error": "Internal server error",
    "timeout_error": "Request timeout",
}
# Static rate-limit headers (B.6); the reset timestamps are refreshed once per second.
_RL_STATIC: Headers = [
    (b"anthropic-organization-id", b"00000000-0000-4000-8000-000000000000"),
    (b"anthropic-ratelimit-requests-limit", b"4000"),
    (b"anthropic-ratelimit-requests-remaining", b"3999"),
    (b"anthropic-ratelimit-tokens-limit", b"2000000"),
    (b"anthropic-ratelimit-tokens-remaining", b"2000000"),
    (b"anthropic-ratelimit-input-tokens-limit", b"2000000"),
    (b"anthropic-ratelimit-input-tokens-remaining", b"2000000"),
    (b"anthropic-ratelimit-output-tokens-limit", b"400000"),
    (b"anthropic-ratelimit-output-tokens-remaining", b"400000"),
]
# An organisation with Priority Tier also gets its priority capacity's state (EmulatorConfig.priority_tier).
PRIORITY_HEADERS: Headers = [
    (b"anthropic-priority-input-tokens-limit", b"1000000"),
    (b"anthropic-priority-input-tokens-remaining", b"999000"),
    (b"anthropic-priority-output-tokens-limit", b"200000"),
    (b"anthropic-priority-output-tokens-remaining", b"199000"),
]
_reset_cache: tuple[int, Headers] = (0, [])


def _reset_headers() -> Headers:
    global _reset_cache
    sec = int(time.time())
    if _reset_cache[0] != sec:
        ts = datetime.fromtimestamp(sec + 1, UTC).strftime("%Y-%m-%dT%H:%M:%SZ").encode()
        _reset_cache = (sec, [(b"anthropic-ratelimit-requests-reset", ts),
                              (b"anthropic-ratelimit-tokens-reset", ts),
                              (b"anthropic-ratelimit-input-tokens-reset", ts),
                              (b"anthropic-ratelimit-output-tokens-reset", ts)])
    return _reset_cache[1]


def headers(call: Call) -> Headers:
    h = [(b"request-id", call.request_id.encode())]
    h.extend(_RL_STATIC)
    h.extend(_reset_headers())
    return h


async def error(emu: Emulator, call: Call, status: int, message: str | None = None,
                etype: str | None = None, extra: Headers | None = None) -> None:
    etype = etype or ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    msg = message or ERROR_MESSAGES.get(etype, etype.replace("_", " "))
    body = {"type": "error", "error": {"type": etype, "message": msg}, "request_id": call.request_id}
    h = headers(call)
    if extra:
        h.extend(extra)
    emu.count_status(status)
    await call.json(status, body, h)


async def ok(emu: Emulator, call: Call, obj: Any) -> None:
    emu.count_status(200)
    await call.json(200, obj, headers(call))


async def answer_page(emu: Emulator, call: Call, rows: list[dict[str, Any]]) -> None:
    """A list endpoint's answer: the page of `rows` that the query's `limit` (1-1000, default 20) and
    `after_id` / `before_id` cursors pick, or the 400 for a `limit` out of range."""
    q = call.query()
    n = limit_of(q, 20, 1000)
    if n is None:
        await error(emu, call, 400, "limit: Input should be between 1 and 1000")
        return
    await ok(emu, call, page(rows, n, q.get("after_id"), q.get("before_id")))


async def authenticate(emu: Emulator, call: Call) -> str | None:
    """The API key (x-api-key or Bearer) after the version check; None once a 4xx is answered."""
    call.request_id = emu.new_id("req_")
    h = call.headers
    key = h.get("x-api-key") or ""
    if not key:
        auth = h.get("authorization", "")
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    if not key:
        await error(emu, call, 401, "x-api-key header is required")
        return None
    keys = emu.config.api_keys
    if keys is not None and key not in keys:
        await error(emu, call, 401, "invalid x-api-key")
        return None
    if emu.config.require_anthropic_version and not h.get("anthropic-version"):
        await error(emu, call, 400, "anthropic-version: header is required")
        return None
    return key


async def preamble(emu: Emulator, call: Call) -> tuple[dict[str, Any], str] | None:
    """(body, api key) for a JSON POST; None once the error has been answered."""
    key = await authenticate(emu, call)
    if key is None:
        return None
    try:
        body = orjson.loads(call.body)
    except orjson.JSONDecodeError as e:
        await error(emu, call, 400, f"There was an error parsing the body of your request: "
                    f"invalid JSON ({e.msg}). Please check that it is valid JSON.")
        return None
    if not isinstance(body, dict):
        await error(emu, call, 400, "Input should be a valid dictionary")
        return None
    return body, key


async def pre_faults(emu: Emulator, call: Call, model: Any,
                     stream: bool) -> tuple[bool, FaultSet | None]:
    """(handled, faults): faults that answer before the first byte are applied here."""

    async def bad_spec(message: str) -> None:
        await error(emu, call, 400, message)

    async def send_fault(status: int, extra: Headers) -> None:
        if status == 429:
            extra.append((b"anthropic-ratelimit-requests-remaining", b"0"))
        await error(emu, call, status, extra=extra)

    name = model if isinstance(model, str) else None
    return await streaming.pre_faults(emu, call, name, stream, bad_spec, send_fault)


async def admit(emu: Emulator, call: Call) -> str | None:
    """Authentication and pre-response faults for a request without a JSON body to read first:
    the API key, or None once an answer has been sent."""
    key = await authenticate(emu, call)
    if key is None:
        return None
    handled, _ = await pre_faults(emu, call, None, False)
    return None if handled else key
