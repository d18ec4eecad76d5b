"""The cached form of an answer and its replay in either shape the client asks for.

An entry stores the provider's complete (non-streaming) response JSON. A streamed answer is folded
into that shape as its events pass; a hit is rendered back as a JSON body, or as a synthesized SSE
stream in the provider's own event format (Anthropic named events; OpenAI chunks, the usage chunk
when `stream_options.include_usage` asks for it, then `[DONE]`). Answers this module cannot replay
faithfully (several choices, logprobs, server-side tool blocks) are simply not cached.
"""

from __future__ import annotations

import copy
import secrets
import time
from typing import Any

import orjson

from sdk.types import Protocol, Usage

Message = dict[str, Any]

_ANTHROPIC_BLOCKS = frozenset({"text", "tool_use", "thinking"})
_ANTHROPIC_STOPS = frozenset({"end_turn", "stop_sequence"})
_OPENAI_STOPS = frozenset({"stop"})
_OPENAI_DELTA_FIELDS = frozenset({"role", "content", "refusal", "tool_calls", "annotations"})  # what a capture folds


def _data(event: bytes) -> bytes:
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            return line[5:].strip()
    return b""


def from_body(protocol: Protocol, body: bytes) -> Message | None:
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return message if isinstance(message, dict) and replayable(protocol, message) else None


def replayable(protocol: Protocol, message: Message) -> bool:
    if protocol is Protocol.ANTHROPIC:
        content = message.get("content")
        return isinstance(content, list) and all(isinstance(b, dict) and b.get("type") in _ANTHROPIC_BLOCKS for b in content)
    choices = message.get("choices")
    return (
        isinstance(choices, list)
        and len(choices) == 1
        and isinstance(choices[0], dict)
        and isinstance(choices[0].get("message"), dict)
        and choices[0].get("logprobs") is None
        and choices[0]["message"].get("audio") is None  # its id expires: a later turn could not refer to it
    )


def completed_safely(protocol: Protocol, message: Message, allow_tool_calls: bool) -> bool:
    """Finished on its own (not cut by max_tokens, filtered, paused or refused), not from a web search, and
    no tool call unless allowed."""
    if protocol is Protocol.ANTHROPIC:
        stop = message.get("stop_reason")
        calls = any(block.get("type") == "tool_use" for block in message.get("content", []))
        return (stop in _ANTHROPIC_STOPS and not calls) or (allow_tool_calls and stop == "tool_use")
    choice = message["choices"][0]
    if choice["message"].get("refusal"):
        return False  # the model's call on one request (`stop` all the same), not the question's answer
    if choice["message"].get("annotations"):
        return False  # url_citations: it searched the web, which answers as it is now, not when stored
    calls = bool(choice["message"].get("tool_calls"))
    stop = choice.get("finish_reason")
    return (stop in _OPENAI_STOPS and not calls) or (allow_tool_calls and stop == "tool_calls" and calls)


def finish_reasons(protocol: Protocol, message: Message) -> list[str]:
    """Why the stored answer stopped, in the provider's words (a replayed stream's finish reasons)."""
    if protocol is Protocol.ANTHROPIC:
        reasons = [message.get("stop_reason")]
    else:
        reasons = [choice.get("finish_reason") for choice in message.get("choices", ()) if isinstance(choice, dict)]
    return [reason for reason in reasons if isinstance(reason, str)]


class StreamCapture:
    """Folds a stream's events into the non-streaming response shape; `message()` is None unless it finished."""

    def __init__(self, protocol: Protocol):
        self.protocol = protocol
        self._message: Message | None = None
        self._partial_json: dict[int, str] = {}
        self._done = False
        self._broken = False  # saw something it cannot reproduce: never store

    def feed(self, event: bytes) -> None:
        if self._broken or self._done:
            return
        data = _data(event)
        if not data:
            return
        try:
            if self.protocol is Protocol.ANTHROPIC:
                self._feed_anthropic(orjson.loads(data))
            elif data == b"[DONE]":
                self._done = self._message is not None
            else:
                self._feed_openai(orjson.loads(data))
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
            self._broken = True

    def message(self) -> Message | None:
        if not self._done or self._broken or self._message is None:
            return None
        return self._message if replayable(self.protocol, self._message) else None

    def _feed_anthropic(self, data: dict[str, Any]) -> None:
        kind = data.get("type")
        if kind == "message_start":
            self._message = {**data["message"], "content": []}
            self._message["usage"] = dict(data["message"].get("usage") or {})
            return
        message = self._message
        if message is None or kind == "error":
            self._broken = True
            return
        if kind == "content_block_start":
            message["content"].append(copy.deepcopy(data["content_block"]))
        elif kind == "content_block_delta":
            block, delta = message["content"][data["index"]], data["delta"]
            match delta.get("type"):
                case "text_delta":
                    block["text"] += delta["text"]
                case "input_json_delta":
                    self._partial_json[data["index"]] = self._partial_json.get(data["index"], "") + delta["partial_json"]
                case "thinking_delta":
                    block["thinking"] += delta["thinking"]
                case "signature_delta":
                    block["signature"] = delta["signature"]
                case _:
                    self._broken = True
        elif kind == "content_block_stop":
            block = message["content"][data["index"]]
            if block.get("type") == "tool_use":
                raw = self._partial_json.pop(data["index"], "")
                block["input"] = orjson.loads(raw) if raw else {}
        elif kind == "message_delta":
            message.update({k: v for k, v in data.get("delta", {}).items() if k in ("stop_reason", "stop_sequence")})
            message["usage"].update(data.get("usage") or {})  # cumulative: overwrite, never add
        elif kind == "message_stop":
            self._done = True

    def _feed_openai(self, data: dict[str, Any]) -> None:
        if "error" in data and "choices" not in data:
            self._broken = True
            return
        if self._message is None:
            self._message = {
                "id": data.get("id"),
                "object": "chat.completion",
                "created": data.get("created"),
                "model": data.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "refusal": None, "annotations": []}, "logprobs": None, "finish_reason": None}],
                "usage": None,
            }
            for extra in ("system_fingerprint", "service_tier"):
                if extra in data:
                    self._message[extra] = data[extra]
        if isinstance(data.get("usage"), dict):
            self._message["usage"] = data["usage"]
        for choice in data.get("choices") or []:
            if choice.get("index", 0) != 0 or choice.get("logprobs") is not None:
                self._broken = True  # several choices or logprobs: not replayed
                return
            self._fold_openai_delta(choice)

    def _fold_openai_delta(self, choice: dict[str, Any]) -> None:
        assert self._message is not None
        target = self._message["choices"][0]
        message, delta = target["message"], choice.get("delta") or {}
        if any(value is not None for key, value in delta.items() if key not in _OPENAI_DELTA_FIELDS):
            self._broken = True  # audio, a legacy function_call, ...: what the replay cannot give back
            return
        if delta.get("annotations"):  # web search citations, in the chunk after the text they cite
            message["annotations"].extend(delta["annotations"])
        for field in ("content", "refusal"):
            if isinstance(delta.get(field), str):
                message[field] = (message[field] or "") + delta[field]
        for call in delta.get("tool_calls") or []:
            calls = message.setdefault("tool_calls", [])
            while len(calls) <= call["index"]:
                calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
            slot = calls[call["index"]]
            slot["id"] = call.get("id") or slot["id"]
            function = call.get("function") or {}
            slot["function"]["name"] += function.get("name") or ""
            slot["function"]["arguments"] += function.get("arguments") or ""
        if choice.get("finish_reason"):
            target["finish_reason"] = choice["finish_reason"]


def fresh_id(prefix: str) -> str:
    """A new id in the provider's style (`chatcmpl-…`, `msg_…`, `call_…`, `toolu_…`): 24 hex digits, so a
    tool call's stays within the 40 characters OpenAI takes back."""
    return prefix + secrets.token_hex(12)


def fresh(protocol: Protocol, message: Message) -> Message:
    """The stored answer as a new one: its own id (and, for OpenAI, creation time), and its own id for
    each tool call, as the providers give every answer; the tool calls keep their names and inputs.
    Only what changes is copied (a deep copy of a long answer was its size again on the loop, per hit)."""
    if protocol is Protocol.ANTHROPIC:
        content = [{**block, "id": fresh_id("toolu_")} if block.get("type") == "tool_use" else block
                   for block in message["content"]]
        return {**message, "id": fresh_id("msg_"), "content": content}
    out = {**message, "id": fresh_id("chatcmpl-"), "created": int(time.time())}
    first, *others = message["choices"]
    calls = first["message"].get("tool_calls")
    if calls:
        answer = {**first["message"], "tool_calls": [{**call, "id": fresh_id("call_")} for call in calls]}
        out["choices"] = [{**first, "message": answer}, *others]
    return out


def openai_usage_object(usage: Usage) -> dict[str, Any]:
    """OpenAI's usage object for the counts the gateway read from a Chat stream's usage chunk, which it
    asks for and takes out when the client did not (sdk/providers/base.py): prompt_tokens includes the
    cached and cache-written tokens, as OpenAI counts them."""
    prompt = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
    details = {"cached_tokens": usage.cache_read_tokens}
    if usage.cache_write_tokens:
        details["cache_write_tokens"] = usage.cache_write_tokens
    return {"prompt_tokens": prompt, "completion_tokens": usage.output_tokens, "total_tokens": prompt + usage.output_tokens,
            "prompt_tokens_details": details}


def render_body(protocol: Protocol, message: Message) -> bytes:
    if protocol is Protocol.OPENAI and message.get("usage") is None:
        # Stored from a stream that did not ask for usage: the tokens were never reported to us.
        message = {**message, "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}
    return orjson.dumps(message)


def render_events(protocol: Protocol, message: Message, include_usage: bool) -> list[bytes]:
    if protocol is Protocol.ANTHROPIC:
        return _anthropic_events(message)
    return _openai_events(message, include_usage)


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _anthropic_events(message: Message) -> list[bytes]:
    usage = dict(message.get("usage") or {})
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None, "usage": {**usage, "output_tokens": 1}}
    events = [_sse("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        if kind == "text":
            empty, deltas = {**block, "text": ""}, [{"type": "text_delta", "text": block["text"]}]
        elif kind == "tool_use":
            empty = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}]
        else:  # thinking
            empty = {**block, "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": block["thinking"]}, {"type": "signature_delta", "signature": block.get("signature", "")}]
        events.append(_sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": empty}))
        events += [_sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}) for d in deltas]
        events.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta = {"stop_reason": message.get("stop_reason"), "stop_sequence": message.get("stop_sequence")}
    events.append(_sse("message_delta", {"type": "message_delta", "delta": delta, "usage": {"output_tokens": usage.get("output_tokens", 0)}}))
    events.append(_sse("message_stop", {"type": "message_stop"}))
    return events


def _openai_events(message: Message, include_usage: bool) -> list[bytes]:
    base: dict[str, Any] = {"id": message.get("id"), "object": "chat.completion.chunk", "created": message.get("created"), "model": message.get("model")}
    for extra in ("system_fingerprint", "service_tier"):
        if extra in message:
            base[extra] = message[extra]
    if include_usage:
        base["usage"] = None

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return b"data: " + orjson.dumps({**base, "choices": [choice]}) + b"\n\n"

    choice = message["choices"][0]
    answer = choice["message"]
    calls = answer.get("tool_calls") or []
    events = [chunk({"role": "assistant", "content": "" if answer.get("content") is not None or not calls else None, "refusal": None})]
    if answer.get("content"):
        events.append(chunk({"content": answer["content"]}))
    if answer.get("annotations"):
        events.append(chunk({"annotations": answer["annotations"]}))
    if answer.get("refusal"):
        events.append(chunk({"refusal": answer["refusal"]}))
    for index, call in enumerate(calls):
        head = {"index": index, "id": call.get("id"), "type": "function", "function": {"name": call["function"]["name"], "arguments": ""}}
        events.append(chunk({"tool_calls": [head]}))
        events.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": call["function"]["arguments"]}}]}))
    events.append(chunk({}, choice.get("finish_reason")))
    if include_usage:
        usage = message.get("usage") or {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        events.append(b"data: " + orjson.dumps({**base, "choices": [], "usage": usage}) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events
