"""Chat Completions' custom tools across a translation to Claude.

A custom tool (`{"type": "custom", "custom": {"name", "description", "format"}}`, OpenAI's freeform-text tools,
which Codex-style agents send through Chat as well as through Responses) takes one string, not JSON; the
model calls it as `{"type": "custom", "custom": {"name", "input"}}`. Claude has JSON tools only, so, as a
Responses custom tool is (responses_requests.custom_function, responses_answers.custom_input):

- the request's custom tools are functions of one string, `input` (a grammar in the description, not
  enforced); a `custom` tool choice is its function's, an allowed_tools list's custom entries their
  functions'; the history's custom calls are calls of those functions with their input as `input`;
- the answer's calls of them are custom tool calls again, their input the string: in a body each call, in a
  stream the call's first chunk (`type: "custom"`, its name and an empty input) and, once Claude has written
  its input whole, one chunk with the input (as the Responses door sends a custom call's input whole).
"""

from __future__ import annotations

from typing import Any

import orjson

from sdk.routing.translation.responses_answers import custom_input
from sdk.routing.translation.responses_requests import CUSTOM_INPUT, custom_function


def names(body: dict[str, Any]) -> frozenset[str]:
    """The names of a Chat request's custom tools, whose calls are answered as custom tool calls."""
    return frozenset(str(_custom(tool).get("name")) for tool in body.get("tools") or () if _is_custom(tool))


def used(body: dict[str, Any]) -> bool:
    """Whether a Chat request offers, chooses or has called a custom tool."""
    choice = body.get("tool_choice")
    listed = choice.get("allowed_tools") if isinstance(choice, dict) else None
    entries = [*(body.get("tools") or ()), choice, *((listed or {}).get("tools") or () if isinstance(listed, dict) else ())]
    return any(_is_custom(entry) for entry in entries) or any(
        _is_custom(call) for message in body.get("messages") or () if isinstance(message, dict)
        for call in message.get("tool_calls") or ())


def as_functions(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with its custom tools, tool choice and history calls as those of functions of one string."""
    out = dict(body)
    if body.get("tools"):
        out["tools"] = [_function(tool) if _is_custom(tool) else tool for tool in body["tools"]]
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and _is_custom(choice) and _custom(choice).get("name") in names(body):  # (else refused)
        out["tool_choice"] = {"type": "function", "function": {"name": _custom(choice).get("name")}}
    elif isinstance(choice, dict) and isinstance(choice.get("allowed_tools"), dict):
        allowed = choice["allowed_tools"]
        tools = [{"type": "function", "function": {"name": _custom(t).get("name")}} if _is_custom(t) else t
                 for t in allowed.get("tools") or ()]
        out["tool_choice"] = {**choice, "allowed_tools": {**allowed, "tools": tools}}
    out["messages"] = [_called(message) for message in body.get("messages") or ()]
    return out


def _is_custom(entry: Any) -> bool:
    return isinstance(entry, dict) and entry.get("type") == "custom"


def _custom(entry: dict[str, Any]) -> dict[str, Any]:
    inner = entry.get("custom")
    return inner if isinstance(inner, dict) else {}


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    """A Chat custom tool as the function a Responses custom tool is (its grammar format, nested in Chat's
    `format.grammar`, as Responses has it: `format.syntax` and `format.definition`)."""
    custom = _custom(tool)
    fmt = custom.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "grammar" and isinstance(fmt.get("grammar"), dict):
        fmt = {"type": "grammar", **fmt["grammar"]}
    function = custom_function({**custom, "format": fmt}, "Anthropic")
    if "cache_control" in tool:  # a breakpoint on the tool (requests._cached)
        function["cache_control"] = tool["cache_control"]
    return function


def _called(message: Any) -> Any:
    """An assistant message's custom tool calls as calls of their functions."""
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not calls or not any(_is_custom(call) for call in calls):
        return message
    return {**message, "tool_calls": [
        {"id": call.get("id"), "type": "function", "function": {
            "name": _custom(call).get("name"), "arguments": orjson.dumps({CUSTOM_INPUT: _custom(call).get("input") or ""}).decode()}}
        if _is_custom(call) else call for call in calls]}


def answered(body: bytes, custom: frozenset[str]) -> bytes:
    """A chat.completion whose calls of `custom` tools are custom tool calls."""
    data = orjson.loads(body)
    for choice in data.get("choices") or ():
        message = choice.get("message") or {}
        message["tool_calls"] = [_as_custom(call, custom) for call in message.get("tool_calls") or ()] or None
        if message["tool_calls"] is None:
            del message["tool_calls"]
    return orjson.dumps(data)


def _as_custom(call: dict[str, Any], custom: frozenset[str]) -> dict[str, Any]:
    function = call.get("function") or {}
    if function.get("name") not in custom:
        return call
    return {"id": call.get("id"), "type": "custom", "custom": {"name": function["name"], "input": custom_input(function.get("arguments") or "")}}


class CustomChunks:
    """A translator's chunks with the calls of `custom` tools as custom tool calls: a call's first chunk as
    a custom call with an empty input, its argument chunks held, and its input sent whole in one chunk
    before whatever follows them (the next call, the finish chunk)."""

    def __init__(self, inner: Any, custom: frozenset[str]) -> None:
        self.inner, self.custom = inner, custom
        self.held: dict[int, list[str]] = {}  # open custom calls (their tool_call index): the arguments written
        self.envelope: dict[str, Any] = {}  # the last chunk's fields but its choices (a held input's chunk has them)

    def feed(self, event: bytes) -> list[bytes]:
        return [out for chunk in self.inner.feed(event) for out in self._custom(chunk)]

    def _custom(self, chunk: bytes) -> list[bytes]:
        if not chunk.startswith(b"data: {") or (b'"tool_calls"' not in chunk and not self.held):
            return [*self._flush(), chunk]
        data = orjson.loads(chunk[len(b"data: "):])
        self.envelope = {k: v for k, v in data.items() if k != "choices"}
        opened: list[int] = []  # custom calls this chunk opens: their input is still to come
        kept = []
        for choice in data.get("choices") or ():
            delta = choice.get("delta") or {}
            calls = []
            for call in delta.get("tool_calls") or ():
                index, function = call.get("index", 0), call.get("function") or {}
                if call.get("type") == "function" and function.get("name") in self.custom:
                    calls.append({"index": index, "id": call.get("id"), "type": "custom", "custom": {"name": function["name"], "input": ""}})
                    self.held[index] = [function.get("arguments") or ""]
                    opened.append(index)
                elif index in self.held and set(call) <= {"index", "function"}:
                    self.held[index].append(function.get("arguments") or "")  # held until the input is whole
                else:
                    calls.append(call)
            if calls:
                delta["tool_calls"] = calls
            else:
                delta.pop("tool_calls", None)
            if delta or choice.get("finish_reason") is not None:
                kept.append(choice)
        if data.get("choices") and not kept:
            return []  # nothing but a held input's arguments
        return [*self._flush(opened), b"data: " + orjson.dumps({**data, "choices": kept}) + b"\n\n"]

    def _flush(self, opened: tuple[int, ...] | list[int] = ()) -> list[bytes]:
        """The held calls' inputs (but those of calls just `opened`), each one chunk."""
        out = []
        for index in [i for i in self.held if i not in opened]:
            text = custom_input("".join(self.held.pop(index)))
            call = {"index": index, "custom": {"input": text}}
            choice = {"index": self.inner.index, "delta": {"tool_calls": [call]}, "logprobs": None, "finish_reason": None}
            out.append(b"data: " + orjson.dumps({**self.envelope, "choices": [choice]}) + b"\n\n")
        return out
