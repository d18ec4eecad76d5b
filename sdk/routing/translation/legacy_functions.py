"""Chat Completions' legacy function calling across a translation to Claude.

Before `tools`, a Chat request offered `functions` (name, description, parameters) and chose with
`function_call` (`"auto"`, `"none"`, `{"name"}`); the model answered with one `function_call` on the
message (`finish_reason: "function_call"`), and the result came back as a `role: "function"` message
naming the function. OpenAI still takes them, and older clients (LangChain's `bind_functions`, early
agent frameworks) still send them. A Claude target takes tools only, so:

- the request is written as its `tools` equivalent first: each function a tool, `function_call` the
  tool choice, an assistant's `function_call` a tool call whose id is derived from its place in the
  conversation (the same every turn, so the cached prefix stays the same), and a `function` message
  the result of the latest call of that name;
- the answer is written back: its first tool call as the message's `function_call` (the legacy shape
  has one), `finish_reason: "function_call"`; a stream's tool-call deltas as `function_call` deltas.
"""

from __future__ import annotations

from typing import Any

import orjson

from sdk.errors import InvalidRequestError


def used(body: dict[str, Any]) -> bool:
    """Whether `body` calls functions the legacy way."""
    messages = body.get("messages")
    return body.get("functions") is not None or body.get("function_call") is not None or (isinstance(messages, list) and any(
        isinstance(m, dict) and (m.get("role") == "function" or m.get("function_call") is not None) for m in messages))


def as_tools(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with its legacy functions written as tools (see the module's doc)."""
    if body.get("tools") is not None and body.get("functions") is not None:
        raise InvalidRequestError("functions: send either tools or the deprecated functions, not both")
    out = {k: v for k, v in body.items() if k not in ("functions", "function_call")}
    if body.get("functions") is not None:
        out["tools"] = [{"type": "function", "function": function} for function in body["functions"]]
    choice = body.get("function_call")
    if isinstance(choice, dict):
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice is not None:
        out["tool_choice"] = choice  # "auto" or "none"
    messages, calls = [], {}  # function name → the id of its latest call
    for i, message in enumerate(body.get("messages") or ()):
        if isinstance(message, dict) and message.get("function_call") is not None:
            call = message["function_call"]
            calls[call.get("name")] = call_id = f"call_fn{i}"
            message = {k: v for k, v in message.items() if k != "function_call"}
            message["tool_calls"] = [{"id": call_id, "type": "function",
                                      "function": {"name": call.get("name"), "arguments": call.get("arguments") or "{}"}}]
        elif isinstance(message, dict) and message.get("role") == "function":
            if message.get("name") not in calls:
                raise InvalidRequestError(f"messages.{i}: a function message for {message.get('name')!r}, which no earlier "
                                          "assistant message called")
            message = {"role": "tool", "tool_call_id": calls[message["name"]], "content": message.get("content") or ""}
        messages.append(message)
    out["messages"] = messages
    return out


def answered(body: bytes) -> bytes:
    """A chat.completion answering a legacy request: each choice's first tool call as its `function_call`."""
    data = orjson.loads(body)
    for choice in data.get("choices") or ():
        message = choice.get("message") or {}
        calls = message.pop("tool_calls", None)
        if calls:
            message["function_call"] = {k: calls[0]["function"].get(k) for k in ("name", "arguments")}
        if choice.get("finish_reason") == "tool_calls":
            choice["finish_reason"] = "function_call"
    return orjson.dumps(data)


class LegacyChunks:
    """A translator's chunks for a legacy request: tool-call deltas of the first call as `function_call` deltas
    (the others left out: the legacy shape has one call), `finish_reason: "function_call"`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def feed(self, event: bytes) -> list[bytes]:
        return [self._legacy(chunk) for chunk in self.inner.feed(event)]

    @staticmethod
    def _legacy(chunk: bytes) -> bytes:
        if not chunk.startswith(b"data: {") or (b'"tool_calls"' not in chunk and b'"finish_reason":"tool_calls"' not in chunk):
            return chunk
        data = orjson.loads(chunk[len(b"data: "):])
        for choice in data.get("choices") or ():
            delta = choice.get("delta") or {}
            calls = [c for c in delta.pop("tool_calls", None) or () if c.get("index", 0) == 0]
            if calls:
                function = calls[0].get("function") or {}
                delta["function_call"] = {k: function[k] for k in ("name", "arguments") if k in function}
            if choice.get("finish_reason") == "tool_calls":
                choice["finish_reason"] = "function_call"
        return b"data: " + orjson.dumps(data) + b"\n\n"
