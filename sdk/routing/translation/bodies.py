"""Complete response bodies and error bodies between the two dialects.

Usage stays exact: OpenAI's prompt_tokens includes cached and cache-written tokens, Anthropic's
input_tokens does not, so the numbers are moved between fields, never estimated.
"""

from __future__ import annotations

import re
import time
from typing import Any

import jiter
import orjson

from sdk.errors import SlipstreamError, error_body
from sdk.routing.translation import context_edits
from sdk.routing.translation.output_modes import validated
from sdk.routing.translation.stops import cut, stopped
from sdk.routing.translation.web_search import ITEMS, annotations_a2o, claude_searches
from sdk.types import Protocol, Usage

# stop_reason ↔ finish_reason (Anthropic's Messages and OpenAI's Chat Completions references).
A2O_STOP = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
            "refusal": "content_filter", "pause_turn": "stop", "model_context_window_exceeded": "length"}
O2A_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
            "content_filter": "refusal"}


def stop_reason_o2a(finish_reason: Any, refused: bool, called: bool = False) -> str:
    """Anthropic's stop_reason for an OpenAI finish_reason; a refusal (`message.refusal`, which OpenAI
    ends with `stop`) is Anthropic's `refusal`. An answer that `called` tools and ended `stop` is `tool_use`:
    OpenAI ends a call of the function the request named (Claude's tool_choice `tool`) with `stop`
    (vllm-project/vllm#25054's captures of OpenAI), where Claude says `tool_use`, which agents loop on."""
    if called and finish_reason == "stop" and not refused:
        return "tool_use"
    return "refusal" if refused else O2A_STOP.get(finish_reason or "", "end_turn")


def usage_a2o(usage: dict[str, Any]) -> dict[str, Any]:
    read = usage.get("cache_read_input_tokens") or 0
    written = usage.get("cache_creation_input_tokens") or 0
    prompt = (usage.get("input_tokens") or 0) + read + written
    completion = usage.get("output_tokens") or 0
    out = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": read, "cache_write_tokens": written}}
    # Claude's thinking, within output_tokens as a reasoning model's reasoning is within completion_tokens (reasoning.py)
    if (thought := thinking_tokens(usage)) > 0:
        out["completion_tokens_details"] = {"reasoning_tokens": thought}
    return out


def thinking_tokens(usage: Any) -> int:
    """The thinking tokens an Anthropic usage object reports (usage.output_tokens_details.thinking_tokens), or 0."""
    details = usage.get("output_tokens_details") if isinstance(usage, dict) else None
    thought = details.get("thinking_tokens") if isinstance(details, dict) else None
    return thought if isinstance(thought, int) else 0


def chat_usage(usage: Usage, thought: int = 0) -> dict[str, Any]:
    """Chat's usage object for usage the gateway holds (a stream's, the sum of several answers'); `thought`: the
    thinking tokens Claude reported within its output tokens."""
    return usage_a2o({"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                      "cache_read_input_tokens": usage.cache_read_tokens, "cache_creation_input_tokens": usage.cache_write_tokens,
                      "output_tokens_details": {"thinking_tokens": thought}})


# OpenAI's service tiers as Anthropic's usage.service_tier ("standard", "priority", "batch"): the default tier is
# Anthropic's standard, priority is priority; flex and scale have no Anthropic tier and are not said.
_TIERS = {"default": "standard", "auto": "standard", "priority": "priority"}


def usage_o2a(usage: dict[str, Any] | None, tier: Any = None) -> dict[str, Any]:
    """An OpenAI usage object (and the answer's `service_tier`) as Anthropic's. OpenAI's cache writes (gpt-5.6 and
    later: `cache_write_tokens`, billed at 1.25x input, kept at least 30 minutes) are Anthropic's 5-minute writes in
    `cache_creation`, the TTL split Anthropic's clients price by: the same 1.25x, and a prefix that outlives five
    minutes (an hour is not promised); `ephemeral_1h_input_tokens` is 0."""
    usage = usage or {}
    details = usage.get("prompt_tokens_details") or {}
    read, written = details.get("cached_tokens") or 0, details.get("cache_write_tokens") or 0
    out: dict[str, Any] = {"input_tokens": max(0, (usage.get("prompt_tokens") or 0) - read - written),
                           "cache_creation_input_tokens": written, "cache_read_input_tokens": read,
                           "cache_creation": {"ephemeral_5m_input_tokens": written, "ephemeral_1h_input_tokens": 0},
                           "output_tokens": usage.get("completion_tokens") or 0}
    # A reasoning model's hidden reasoning, within completion_tokens as Claude's thinking is within output_tokens.
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    if isinstance(reasoning, int) and reasoning > 0:
        out["output_tokens_details"] = {"thinking_tokens": reasoning}
    if (served := service_tier_o2a(tier)) is not None:
        out["service_tier"] = served
    return out


# Anthropic's usage.service_tier as the `service_tier` an OpenAI answer names (standard is OpenAI's default tier;
# batch, the Message Batches API's, has no Chat counterpart and is not said).
_A2O_TIERS = {"standard": "default", "priority": "priority"}


def service_tier_a2o(usage: Any) -> dict[str, str]:
    """`{"service_tier": TIER}` for a Claude answer's usage, as a Chat answer (each chunk of a stream) carries it."""
    tier = _A2O_TIERS.get(str(usage.get("service_tier"))) if isinstance(usage, dict) else None
    return {"service_tier": tier} if tier else {}


def service_tier_o2a(tier: Any) -> str | None:
    """Anthropic's usage.service_tier for the tier an OpenAI answer says it was served on (None: no counterpart)."""
    return _TIERS.get(tier) if isinstance(tier, str) else None


def message_a2o(body: bytes, prefill: str | None = None, stops: tuple[str, ...] = (), searches: bool = False) -> bytes:
    """An Anthropic message as an OpenAI chat.completion. For a JSON-mode request that Claude answers by
    instruction, `prefill` is its assistant prefill ("" for none, output_modes.py): re-attached, and the
    text validated as JSON. The text is cut at the first of `stops` (the Chat stops Claude refuses,
    stops.py), which ends the answer there. `searches`: the message carries Claude's web searches (web_search.ITEMS)."""
    data = orjson.loads(body)
    blocks = [b for b in data.get("content") or () if b.get("type") == "text"]
    texts = [b["text"] for b in blocks]
    text, stopped = cut("".join(texts), stops)
    annotations = annotations_a2o(blocks, len(prefill or ""), len(prefill or "") + len(text))  # web search citations
    if prefill is not None:
        text = validated(prefill + text, data.get("stop_reason") == "max_tokens" or stopped)
    calls = [] if stopped else [
        {"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": orjson.dumps(b.get("input") or {}).decode()}}
        for b in data.get("content") or () if b.get("type") == "tool_use"]
    message: dict[str, Any] = {"role": "assistant", "content": text if texts or prefill else None, "refusal": None}
    if calls:
        message["tool_calls"] = calls
    if annotations:
        message["annotations"] = annotations
    if searches and (ran := claude_searches(data.get("content") or [])):
        message[ITEMS] = ran
    finish = "stop" if stopped else A2O_STOP.get(data.get("stop_reason") or "", "stop")
    return orjson.dumps({
        "id": f"chatcmpl-{data.get('id', '')}", "object": "chat.completion", "created": int(time.time()),
        "model": data.get("model"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": usage_a2o(data.get("usage") or {}), **service_tier_a2o(data.get("usage")),
    })


def diagnostics_o2a(request: dict[str, Any]) -> dict[str, Any]:
    """What a translated Messages answer says to a request's `diagnostics` (Anthropic's prompt-cache divergence
    report against `previous_message_id`): an OpenAI target cannot compare prompts, so a named previous message
    gets `cache_miss_reason: unavailable` ("the API can't give a diagnosis; the request itself was processed
    normally"), never the `null` that says no divergence was found; the first turn's opt-in (no id) gets `null`,
    as from Anthropic. Nothing when the request asked for none."""
    asked = request.get("diagnostics")
    if not isinstance(asked, dict):
        return {}
    return {"diagnostics": {"cache_miss_reason": {"type": "unavailable"}} if asked.get("previous_message_id") else None}


def extra_o2a(request: dict[str, Any], edits: context_edits.Edits = context_edits.edited) -> dict[str, Any]:
    """The fields a translated Messages answer carries besides the usual: what it says to the request's
    `diagnostics` and `context_management` (context_edits.answered, its edits had by `edits`)."""
    return {**diagnostics_o2a(request), **context_edits.answered(request, edits)}


def completion_o2a(body: bytes, extra: dict[str, Any] | None = None, names: dict[str, str] | None = None,
                   stops: tuple[str, ...] = ()) -> bytes:
    """An OpenAI chat.completion as an Anthropic message (with `extra` fields: extra_o2a); `names` are the
    client's tool names the upstream knows by shorter ones (tool_ids.shortened_tool_names). The text is cut at the first
    of `stops` (the stop sequences the model would refuse, stops.openai_stops), which ends the answer there."""
    data = orjson.loads(body)
    choice = (data.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    text, matched = stopped(message.get("content") or message.get("refusal") or "", stops)  # a refusal is the text, ending it `refusal`
    if text:
        content.append({"type": "text", "text": text})
    cut = choice.get("finish_reason") == "length"
    for call in () if matched else message.get("tool_calls") or ():
        function = call.get("function") or {}
        name = function.get("name")
        content.append({"type": "tool_use", "id": call["id"], "name": (names or {}).get(str(name), name), "input": _arguments(call, cut)})
    return orjson.dumps({
        "id": f"msg_{data.get('id', '')}", "type": "message", "role": "assistant", "model": data.get("model"),
        "content": content, **({"stop_reason": "stop_sequence", "stop_sequence": matched} if matched else
                               stop_o2a(choice, bool(message.get("refusal")), bool(message.get("tool_calls")))),
        "usage": usage_o2a(data.get("usage"), data.get("service_tier")), **(extra or {}),
    })


def stop_o2a(choice: dict[str, Any], refused: bool, called: bool = False) -> dict[str, Any]:
    """An OpenAI choice's end as Anthropic's `stop_reason` and `stop_sequence` (`called`: it called tools).
    OpenAI's `stop` covers both a natural end and a stop string; vLLM-style servers (the bundled engine too)
    name the string in `stop_reason` (a token id there is not a sequence the client sent)."""
    matched = choice.get("stop_reason")
    if choice.get("finish_reason") == "stop" and not refused and not called and isinstance(matched, str):
        return {"stop_reason": "stop_sequence", "stop_sequence": matched}
    return {"stop_reason": stop_reason_o2a(choice.get("finish_reason"), refused, called), "stop_sequence": None}


def _arguments(call: dict[str, Any], cut: bool) -> Any:
    """A tool call's arguments as Claude's tool_use input. A call `cut` by the output limit (finish_reason
    `length`) ends mid-arguments: its input is what was written, read as the SDKs read a streamed tool_use
    that ended early (jiter's partial mode), since Claude too answers with the cut tool_use and stop_reason
    `max_tokens`. Other arguments that are not JSON are the upstream's fault."""
    arguments = (call.get("function") or {}).get("arguments") or "{}"
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        if not cut:
            raise SlipstreamError(f"the upstream's arguments of tool call {call.get('id')!r} are not JSON; "
                                  "an Anthropic tool_use needs an object", status=502) from None
    try:
        written = jiter.from_json(arguments.encode(), partial_mode=True)
    except ValueError:  # not even the start of JSON
        written = None
    return written if isinstance(written, dict) else {}


def error_message(body: bytes) -> str:
    """The human message of either dialect's error body (or the raw text)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace")[:500]
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if isinstance(message, str):
        return message
    return body.decode("utf-8", "replace")[:500]


# A prompt over the model's context window, in each provider's words: Anthropic's 400 "prompt is too long:
# 208310 tokens > 200000 maximum" (or, counting max_tokens, "input length and `max_tokens` exceed context
# limit: 188059 + 20000 > 200000"), OpenAI's 400 code context_length_exceeded, "This model's maximum context
# length is 128000 tokens. However, your messages resulted in 130000 tokens. ...". Coding agents compact
# the conversation on their own provider's: Claude Code on "prompt is too long", Codex and the OpenAI Agents
# SDK on the code, so a translated target's overflow is put in the client's provider's words.
_ANTHROPIC_OVERFLOW = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum|exceed context limit: ")
_OPENAI_OVERFLOW = re.compile(r"maximum context length is (\d+) tokens\. However, your messages resulted in (\d+) tokens")


def _overflow(body: bytes, message: str) -> tuple[str, str] | None:
    """(prompt tokens, context window) of a context-overflow error, or None. Both are "" where the message does
    not say the prompt alone is over the window (Anthropic's input + max_tokens), which is then kept as it is."""
    if match := _ANTHROPIC_OVERFLOW.search(message):
        return (match[1], match[2]) if match[1] else ("", "")
    if match := _OPENAI_OVERFLOW.search(message):
        return match[2], match[1]
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return ("", "") if isinstance(error, dict) and error.get("code") == "context_length_exceeded" else None


# OpenAI's Responses API words an overflow its own way, naming `input` (Codex and the Agents SDK read the code;
# opencode and others the message), not Chat's "your messages resulted in N tokens" naming `messages`.
RESPONSES_OVERFLOW = "Your input exceeds the context window of this model. Please adjust your input and try again."


def responses_error(body: bytes) -> bytes:
    """A Chat Completions error body (a Chat upstream's, or a translated one's) as the Responses API gives it: a
    context overflow in its words; any other as it is."""
    if _overflow(body, error_message(body)) is None:
        return body
    return orjson.dumps({"error": {"message": RESPONSES_OVERFLOW, "type": "invalid_request_error", "param": "input",
                                   "code": "context_length_exceeded"}})


def error_for(client: Protocol, status: int, body: bytes) -> bytes:
    """An upstream error body reshaped for the client's dialect, keeping status and message; a context
    overflow in the client's provider's own words, which its agents recognise."""
    message = error_message(body)
    overflow = _overflow(body, message) if status == 400 else None
    if overflow is None:
        return error_body(client, status, message)
    tokens, window = overflow
    if client is Protocol.ANTHROPIC:
        return error_body(client, status, f"prompt is too long: {tokens} tokens > {window} maximum" if tokens
                          else f"prompt is too long: {message}")
    if tokens:
        message = (f"This model's maximum context length is {window} tokens. However, your messages resulted in "
                   f"{tokens} tokens. Please reduce the length of the messages.")
    return orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": "messages",
                                   "code": "context_length_exceeded"}})
