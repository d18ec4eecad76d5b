"""Anthropic Messages API: POST /v1/messages (+ ?beta=true) and /v1/messages/count_tokens.

Wire format per reference B.1-B.7; caching per A.4-A.11 (see caching.py).
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from .asgi import JSON_CT, SSE_HEADERS, Call, Headers
from .caching import CacheError, CachePlan, count_input_tokens, plan_anthropic
from .faults import FaultSpecError
from .reply import Reply, ToolPick, make_reply
from .streaming import apply_pre_faults, respond_after, run_stream
from .text import seed_for, split_chunks, split_deltas, wants_tool

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
STOP_REASONS = {"end": "end_turn", "max": "max_tokens", "stop_sequence": "stop_sequence",
                "tool": "tool_use"}
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")

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


def _headers(call: Call) -> Headers:
    h = [(b"request-id", call.request_id.encode())]
    h.extend(_RL_STATIC)
    h.extend(_reset_headers())
    return h


async def _error(emu: Emulator, call: Call, status: int, message: str | None = None,
                 etype: str | None = None, extra: Headers | None = None) -> None:
    etype = etype or ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    msg = message or ERROR_MESSAGES.get(etype, etype.replace("_", " "))
    body = {"type": "error", "error": {"type": etype, "message": msg}, "request_id": call.request_id}
    h = _headers(call)
    if extra:
        h.extend(extra)
    emu.count_status(status)
    await call.json(status, body, h)


def _retry_headers(retry_after: float | None, retry_after_ms: float | None) -> Headers:
    h: Headers = []
    if retry_after is not None:
        h.append((b"retry-after", _num(retry_after)))
    if retry_after_ms is not None:
        h.append((b"retry-after-ms", _num(retry_after_ms)))
    return h


def _num(x: float) -> bytes:
    return (str(int(x)) if float(x).is_integer() else str(x)).encode()


async def _preamble(emu: Emulator, call: Call) -> tuple[dict[str, Any], str] | None:
    """Auth, version header and JSON parsing -> (body, api key); on failure answers the error
    itself and returns None."""
    call.request_id = emu.new_id("req_")
    h = call.headers
    key = h.get("x-api-key") or ""
    if not key:
        auth = h.get("authorization", "")
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    if not key:
        await _error(emu, call, 401, "x-api-key header is required")
        return None
    keys = emu.config.api_keys
    if keys is not None and key not in keys:
        await _error(emu, call, 401, "invalid x-api-key")
        return None
    if emu.config.require_anthropic_version and not h.get("anthropic-version"):
        await _error(emu, call, 400, "anthropic-version: header is required")
        return None
    try:
        body = orjson.loads(call.body)
    except orjson.JSONDecodeError as e:
        await _error(emu, call, 400, f"There was an error parsing the body of your request: "
                     f"invalid JSON ({e.msg}). Please check that it is valid JSON.")
        return None
    if not isinstance(body, dict):
        await _error(emu, call, 400, "Input should be a valid dictionary")
        return None
    return body, key


def _validate(body: dict[str, Any], count_only: bool) -> str | None:
    """First validation error, with the API's `path: message` style, or None."""
    model = body.get("model")
    if model is None:
        return "model: Field required"
    if not isinstance(model, str) or not model:
        return "model: Input should be a valid string"
    mt = body.get("max_tokens")
    if not count_only:
        if mt is None:
            return "max_tokens: Field required"
        if not isinstance(mt, int) or isinstance(mt, bool):
            return "max_tokens: Input should be a valid integer"
        if mt < 0:
            return "max_tokens: Input should be greater than or equal to 0"
    msgs = body.get("messages")
    if msgs is None:
        return "messages: Field required"
    if not isinstance(msgs, list):
        return "messages: Input should be a valid list"
    if not msgs:
        return "messages: at least one message is required"
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            return f"messages.{i}: Input should be a valid dictionary"
        if m.get("role") not in ("user", "assistant", "system"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        if "content" not in m:
            return f"messages.{i}.content: Field required"
        c = m["content"]
        if not isinstance(c, (str, list)):
            return f"messages.{i}.content: Input should be a valid string or a valid list"
        if not c and not (i == len(msgs) - 1 and m["role"] == "assistant"):
            return (f"messages.{i}: all messages must have non-empty content except for the "
                    "optional final assistant message")
        if isinstance(c, list):
            for j, b in enumerate(c):
                err = _validate_block(b, f"messages.{i}.content.{j}")
                if err:
                    return err
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        if not isinstance(system, list):
            return "system: Input should be a valid string or a valid list"
        for j, b in enumerate(system):
            if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
                return f"system.{j}: Input should be a text block"
    for name, hi in (("temperature", 1), ("top_p", 1)):
        v = body.get(name)
        if v is not None:
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                return f"{name}: Input should be a valid number"
            if v < 0:
                return f"{name}: Input should be greater than or equal to 0"
            if v > hi:
                return f"{name}: Input should be less than or equal to {hi}"
    if "stream" in body and not isinstance(body["stream"], bool):
        return "stream: Input should be a valid boolean"
    ss = body.get("stop_sequences")
    if ss is not None and (not isinstance(ss, list) or not all(isinstance(s, str) for s in ss)):
        return "stop_sequences: Input should be a valid list of strings"
    return _validate_tools(body, mt, count_only)


def _validate_block(b: Any, path: str) -> str | None:
    if not isinstance(b, dict):
        return f"{path}: Input should be a valid dictionary"
    t = b.get("type")
    if not isinstance(t, str):
        return f"{path}.type: Field required"
    if t == "text" and not isinstance(b.get("text"), str):
        return f"{path}.text.text: Field required"
    if t == "tool_use":
        for k in ("id", "name", "input"):
            if k not in b:
                return f"{path}.tool_use.{k}: Field required"
        if not isinstance(b["input"], dict):
            return f"{path}.tool_use.input: Input should be a valid dictionary"
    if t == "tool_result" and not isinstance(b.get("tool_use_id"), str):
        return f"{path}.tool_result.tool_use_id: Field required"
    return None


def _validate_tools(body: dict[str, Any], mt: Any, count_only: bool) -> str | None:
    tools = body.get("tools")
    names: list[str] = []
    if tools is not None:
        if not isinstance(tools, list):
            return "tools: Input should be a valid list"
        for i, t in enumerate(tools):
            if not isinstance(t, dict):
                return f"tools.{i}: Input should be a valid dictionary"
            if t.get("type") in (None, "custom"):
                if not isinstance(t.get("name"), str) or not _TOOL_NAME.match(t["name"]):
                    return f"tools.{i}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'"
                if not isinstance(t.get("input_schema"), dict):
                    return f"tools.{i}.custom.input_schema: Field required"
            if isinstance(t.get("name"), str):
                names.append(t["name"])
    tc = body.get("tool_choice")
    if tc is not None:
        if not isinstance(tc, dict) or tc.get("type") not in ("auto", "any", "tool", "none"):
            return ("tool_choice: Input tag does not match any of the expected tags: "
                    "'auto', 'any', 'tool', 'none'")
        if tc["type"] == "tool":
            if not isinstance(tc.get("name"), str):
                return "tool_choice.tool.name: Field required"
            if tc["name"] not in names:
                return f"Tool '{tc['name']}' not found in provided tools"
        if tc["type"] in ("any", "tool") and not names:
            return "tool_choice may only be specified while providing tools."
    th = body.get("thinking")
    if th is not None:
        if not isinstance(th, dict) or th.get("type") not in ("enabled", "adaptive", "disabled"):
            return ("thinking: Input tag does not match any of the expected tags: "
                    "'enabled', 'adaptive', 'disabled'")
        if th["type"] == "enabled":
            bt = th.get("budget_tokens")
            if not isinstance(bt, int) or bt < 1024:
                return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
            if not count_only and isinstance(mt, int) and mt and bt >= mt:
                return "`max_tokens` must be greater than `thinking.budget_tokens`."
    if not count_only and mt == 0:
        oc = body.get("output_config")
        if body.get("stream"):
            return "max_tokens: 0 is not supported with stream=true"
        if isinstance(th, dict) and th.get("type") == "enabled":
            return "max_tokens: 0 is not supported with extended thinking"
        if isinstance(tc, dict) and tc.get("type") in ("any", "tool"):
            return "max_tokens: 0 is not supported with tool_choice of type 'any' or 'tool'"
        if isinstance(oc, dict) and oc.get("format") is not None:
            return "max_tokens: 0 is not supported with output_config.format"
    return None


def _last_user(messages: list[dict[str, Any]]) -> tuple[str, bool]:
    """(text of the last user message, whether it carries tool results)."""
    for m in reversed(messages):
        if m.get("role") != "user":
            continue
        c = m.get("content")
        if isinstance(c, str):
            return c, False
        texts = [b.get("text", "") for b in c if isinstance(b, dict) and b.get("type") == "text"]
        has_result = any(isinstance(b, dict) and b.get("type") == "tool_result" for b in c)
        return "\n".join(texts), has_result
    return "", False


def _pick_tool(body: dict[str, Any]) -> ToolPick | None:
    """Forced choices (`any`/`tool`) always call; `auto` calls when the last user text names a
    tool or says "use a tool" (never right after a tool_result); `none` never calls."""
    tools = [t for t in body.get("tools") or () if isinstance(t.get("input_schema"), dict)]
    if not tools:
        return None
    tc = body.get("tool_choice") or {"type": "auto"}
    kind = tc.get("type")
    if kind == "none":
        return None
    by_name = {t["name"]: t for t in tools}
    if kind == "tool":
        return ToolPick(tc["name"], by_name[tc["name"]]["input_schema"], False)
    text, after_result = _last_user(body["messages"])
    name = wants_tool(text, list(by_name))
    if kind == "any":
        name = name or tools[0]["name"]
        return ToolPick(name, by_name[name]["input_schema"], False)
    if name is None or after_result:
        return None
    return ToolPick(name, by_name[name]["input_schema"], True)


def _usage(plan: CachePlan, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": plan.input_tokens,
        "cache_creation_input_tokens": plan.write,
        "cache_read_input_tokens": plan.read,
        "cache_creation": {"ephemeral_5m_input_tokens": plan.write_5m,
                           "ephemeral_1h_input_tokens": plan.write_1h},
        "output_tokens": output_tokens,
        "service_tier": "standard",
    }


def _natural_length(emu: Emulator, call: Call) -> int:
    v = call.headers.get("x-emulator-output-tokens")
    return int(v) if v and v.isdigit() else emu.config.default_output_tokens


async def messages(emu: Emulator, call: Call) -> None:
    pre = await _preamble(emu, call)
    if pre is None:
        return
    body, key = pre  # the key scopes the prompt cache (one workspace per key)
    model = body.get("model")
    stream = body.get("stream") is True
    try:
        faults = emu.take_faults(call, model if isinstance(model, str) else None, stream)
    except FaultSpecError as e:
        await _error(emu, call, 400, f"x-emulator-fault: {e}")
        return

    async def send_fault(status: int, ra: float | None, ra_ms: float | None) -> None:
        extra = _retry_headers(ra, ra_ms)
        if status == 429:
            extra.append((b"anthropic-ratelimit-requests-remaining", b"0"))
        await _error(emu, call, status, extra=extra)

    if await apply_pre_faults(emu, call, faults, stream, send_fault):
        return
    err = _validate(body, count_only=False)
    if err:
        await _error(emu, call, 400, err)
        return
    cfg = emu.config
    try:
        plan = plan_anthropic(emu.state.anthropic_cache, body, key, model, call.start,
                              cfg.cache_lookback, cfg.max_breakpoints)
    except CacheError as e:
        await _error(emu, call, 400, str(e))
        return
    tool = _pick_tool(body)
    reply = make_reply(seed_for(model, body["messages"]), _natural_length(emu, call),
                       body["max_tokens"], body.get("stop_sequences") or [], tool)
    msg_id = emu.new_id("msg_")
    tool_id = emu.new_id("toolu_") if reply.tool_name else ""
    ttft = cfg.ttft_seconds(plan.uncached, plan.read)
    if stream:
        events, tokens = _stream_events(emu, msg_id, model, plan, reply, tool_id)
        err_type = faults.midstream_type if faults else "overloaded_error"
        err_ev = _sse("error", {"type": "error", "error": {
            "type": err_type, "message": ERROR_MESSAGES.get(err_type, err_type)}})
        headers = _headers(call)
        headers.extend(SSE_HEADERS)
        await run_stream(emu, call, headers, events, tokens, faults, err_ev, ttft, plan.commit)
        return
    content: list[dict[str, Any]] = []
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    if reply.tool_name:
        content.append({"type": "tool_use", "id": tool_id, "name": reply.tool_name,
                        "input": reply.tool_input})
    out = {"id": msg_id, "type": "message", "role": "assistant", "model": model,
           "content": content, "stop_reason": STOP_REASONS[reply.stop],
           "stop_sequence": reply.stop_sequence, "usage": _usage(plan, reply.output_tokens)}
    headers = _headers(call)
    headers.append(JSON_CT)
    delay = ttft + cfg.per_output_token_ms * reply.output_tokens / 1000.0
    await respond_after(emu, call, delay, 200, orjson.dumps(out), headers, plan.commit)


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


_PING = _sse("ping", {"type": "ping"})
_MESSAGE_STOP = _sse("message_stop", {"type": "message_stop"})


def _stream_events(emu: Emulator, msg_id: str, model: str, plan: CachePlan, reply: Reply,
                   tool_id: str) -> tuple[list[bytes], list[int]]:
    """The B.4 event sequence, with per-event token counts used for pacing."""
    usage = _usage(plan, 1)
    ev = [_sse("message_start", {"type": "message_start", "message": {
        "id": msg_id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": usage}})]
    toks = [0]
    index = 0
    k = emu.config.tokens_per_delta
    if reply.text:
        ev.append(_sse("content_block_start", {"type": "content_block_start", "index": 0,
                                               "content_block": {"type": "text", "text": ""}}))
        ev.append(_PING)
        toks += [0, 0]
        for piece in split_deltas(reply.text, k):
            ev.append(_sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                   "delta": {"type": "text_delta", "text": piece}}))
            toks.append(k)
        ev.append(_sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
        toks.append(0)
        index = 1
    if reply.tool_name:
        ev.append(_sse("content_block_start", {"type": "content_block_start", "index": index,
                                               "content_block": {"type": "tool_use", "id": tool_id,
                                                                 "name": reply.tool_name,
                                                                 "input": {}}}))
        toks.append(0)
        if index == 0:
            ev.append(_PING)
            toks.append(0)
        for frag in [""] + split_chunks(reply.tool_json, 3):
            ev.append(_sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                   "delta": {"type": "input_json_delta",
                                                             "partial_json": frag}}))
            toks.append(max(0, len(frag) // 4))
        ev.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
        toks.append(0)
    ev.append(_sse("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": STOP_REASONS[reply.stop],
                                               "stop_sequence": reply.stop_sequence},
                                     "usage": {"output_tokens": reply.output_tokens}}))
    ev.append(_MESSAGE_STOP)
    toks += [0, 0]
    return ev, toks


async def count_tokens(emu: Emulator, call: Call) -> None:
    pre = await _preamble(emu, call)
    if pre is None:
        return
    body = pre[0]
    model = body.get("model")
    try:
        faults = emu.take_faults(call, model if isinstance(model, str) else None, False)
    except FaultSpecError as e:
        await _error(emu, call, 400, f"x-emulator-fault: {e}")
        return

    async def send_fault(status: int, ra: float | None, ra_ms: float | None) -> None:
        await _error(emu, call, status, extra=_retry_headers(ra, ra_ms))

    if await apply_pre_faults(emu, call, faults, False, send_fault):
        return
    err = _validate(body, count_only=True)
    if err:
        await _error(emu, call, 400, err)
        return
    headers = _headers(call)
    emu.count_status(200)
    await call.json(200, {"input_tokens": count_input_tokens(body)}, headers)
