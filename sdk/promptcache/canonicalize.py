"""Canonical JSON where key order carries no meaning, so equal prompts hash equal (always safe).

Providers render tool schemas and tool inputs in the key order the client sent (reference A.8,
E.2: Go/Rust maps, Swift, `json.dumps` without sort_keys), so a client whose maps iterate in random
order busts the cache on every call. Object keys are sorted recursively; lists (`required`, `enum`,
`anyOf`, ...) keep their order because it can carry meaning. Whitespace is the serializer's
(orjson, compact) for everything we rebuild. Untouched values are returned as the same objects, and
the caller's dicts are never mutated: the SDK passes the application's own history.

Not canonicalized on purpose: `response_format` schemas (their key order is the order of the
answer's fields) and tool_result text (it is content, even when it looks like JSON).
"""

from __future__ import annotations

from typing import Any

import orjson

from sdk.types import Protocol


def sorted_json(value: Any) -> Any:
    """`value` with object keys sorted recursively; the same object when already canonical."""
    if isinstance(value, dict):
        keys = list(value)
        items = {k: sorted_json(value[k]) for k in sorted(keys)}
        if keys == list(items) and all(items[k] is value[k] for k in keys):
            return value
        return items
    if isinstance(value, list):
        elements = [sorted_json(v) for v in value]
        return value if all(a is b for a, b in zip(elements, value, strict=True)) else elements
    return value


def _replace(items: list[Any], index: int, new: Any, copied: list[Any] | None) -> list[Any]:
    copied = copied if copied is not None else list(items)
    copied[index] = new
    return copied


def _anthropic_tools(tools: list[Any]) -> list[Any]:
    out: list[Any] | None = None
    for i, tool in enumerate(tools):
        if isinstance(tool, dict) and isinstance(tool.get("input_schema"), dict):
            schema = sorted_json(tool["input_schema"])
            if schema is not tool["input_schema"]:
                out = _replace(tools, i, {**tool, "input_schema": schema}, out)
    return out if out is not None else tools


def _anthropic_messages(messages: list[Any]) -> list[Any]:
    out: list[Any] | None = None
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        new_content: list[Any] | None = None
        for j, block in enumerate(content):
            if isinstance(block, dict) and block.get("type") in ("tool_use", "server_tool_use") and isinstance(block.get("input"), dict):
                value = sorted_json(block["input"])
                if value is not block["input"]:
                    new_content = _replace(content, j, {**block, "input": value}, new_content)
        if new_content is not None:
            out = _replace(messages, i, {**message, "content": new_content}, out)
    return out if out is not None else messages


def _openai_tools(tools: list[Any]) -> list[Any]:
    out: list[Any] | None = None
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("parameters"), dict):
            params = sorted_json(function["parameters"])
            if params is not function["parameters"]:
                out = _replace(tools, i, {**tool, "function": {**function, "parameters": params}}, out)
    return out if out is not None else tools


def _canonical_arguments(arguments: str) -> str:
    """Tool-call arguments are a JSON string: re-serialize an object with sorted keys, compactly."""
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    if not isinstance(parsed, dict):
        return arguments
    canonical = orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS).decode()
    return arguments if canonical == arguments else canonical


def _openai_messages(messages: list[Any]) -> list[Any]:
    out: list[Any] | None = None
    for i, message in enumerate(messages):
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if not isinstance(calls, list):
            continue
        new_calls: list[Any] | None = None
        for j, call in enumerate(calls):
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                arguments = _canonical_arguments(function["arguments"])
                if arguments is not function["arguments"]:
                    new_calls = _replace(calls, j, {**call, "function": {**function, "arguments": arguments}}, new_calls)
        if new_calls is not None:
            out = _replace(messages, i, {**message, "tool_calls": new_calls}, out)
    return out if out is not None else messages


def canonicalize(protocol: Protocol, body: dict[str, Any]) -> dict[str, Any]:
    """The body with canonical tool schemas and tool inputs; `body` itself when nothing changes."""
    tools, messages = body.get("tools"), body.get("messages")
    if protocol is Protocol.ANTHROPIC:
        new_tools = _anthropic_tools(tools) if isinstance(tools, list) else tools
        new_messages = _anthropic_messages(messages) if isinstance(messages, list) else messages
    else:
        new_tools = _openai_tools(tools) if isinstance(tools, list) else tools
        new_messages = _openai_messages(messages) if isinstance(messages, list) else messages
    if new_tools is tools and new_messages is messages:
        return body
    out = dict(body)
    if new_tools is not tools:
        out["tools"] = new_tools
    if new_messages is not messages:
        out["messages"] = new_messages
    return out
