"""OpenAI's explicit prompt-cache breakpoints as Claude's, and Claude's as OpenAI's.

openai 3.x sends `prompt_cache_breakpoint: {"mode": "explicit", "ttl": ...}` on a Chat content part (text,
image, file; a Responses input part the same), marking the exact end of a prefix to cache (gpt-5.6 and later).
Claude's counterpart is a `cache_control` breakpoint on the block made from that part; without it a
Claude target never caches the prefix the client chose. OpenAI writes at most the latest four explicit
breakpoints of a request and reads earlier ones; Claude answers more than four `cache_control` markers with a
400, so the latest that fit beside the request's own `cache_control` markers become Claude's. The `ttl` (a
minimum lifetime, 30m or 12h) has no Claude counterpart: a Claude prefix lives 5 minutes or, by the team
policy's `prompt_cache.ttl`, an hour (fields.py names it dropped, as `prompt_cache_retention`).
"""

from __future__ import annotations

import re
from typing import Any

BREAKPOINT = "prompt_cache_breakpoint"
CLAUDE_MAX_BREAKPOINTS = 4  # Anthropic: "A maximum of 4 blocks with cache_control may be provided"


def _parts(message: Any) -> list[Any]:
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, list) else []


def marked(part: Any) -> bool:
    """Whether a content part carries OpenAI's explicit breakpoint (and not already Claude's marker)."""
    return isinstance(part, dict) and isinstance(part.get(BREAKPOINT), dict) and part.get("cache_control") is None


def with_claude_breakpoints(body: dict[str, Any]) -> list[Any]:
    """`body`'s messages with the latest explicit breakpoints that fit as `cache_control` on their parts. Only the
    messages holding one are copied (shallowly): the rest are the client's own objects."""
    messages = body.get("messages") or []
    chosen = [id(part) for message in messages for part in _parts(message) if marked(part)]
    if not chosen:
        return messages
    tools = body.get("tools")
    markers = [body.get("cache_control"), *(tool_marker(t) for t in tools or () if isinstance(t, dict))]
    for message in messages:
        if isinstance(message, dict):
            markers += [message.get("cache_control"), *(p.get("cache_control") for p in _parts(message) if isinstance(p, dict))]
    room = max(0, CLAUDE_MAX_BREAKPOINTS - sum(marker is not None for marker in markers))
    kept = set(chosen[len(chosen) - room:]) if room else set()
    out = []
    for message in messages:
        parts = _parts(message)
        if any(id(part) in kept for part in parts):
            content = [{**part, "cache_control": {"type": "ephemeral"}} if id(part) in kept else part for part in parts]
            message = {**message, "content": content}
        out.append(message)
    return out


def tool_marker(tool: dict[str, Any]) -> Any:
    """A Chat tool's `cache_control`: on the tool, as OpenRouter's Chat API takes it for Claude, or inside its `function`,
    where other clients write it (agent frameworks' Claude-through-OpenAI-format paths mark the last tool's function)."""
    function = tool.get("function")
    return tool.get("cache_control") if tool.get("cache_control") is not None or not isinstance(function, dict) else function.get("cache_control")


def lifetimes(messages: Any) -> bool:
    """Whether a Chat conversation's explicit breakpoints name a `ttl`, which a Claude target cannot keep."""
    return any(marked(part) and part[BREAKPOINT].get("ttl") is not None
               for message in (messages if isinstance(messages, list) else ()) for part in _parts(message))


# OpenAI models that take explicit breakpoints (and prompt_cache_options): gpt-5.6 and later, also under a router's
# vendor prefix. They read a cached prefix only where a breakpoint ends it ("match a cache entry exactly at a breakpoint
# instead of falling back to a shorter unmarked prefix"): without one where the client's prefix ends (a coding agent's
# system prompt, shared by its sessions and subagents), a new conversation writes that prefix again at 1.25x instead
# of reading it. A Messages client's `cache_control` on a system, user or tool-result block is that marker; on a
# tool or an assistant block it has no place (OpenAI takes breakpoints on input content parts only).
_EXPLICIT = re.compile(r"^([\w.-]+/)?gpt-(5\.([6-9]|[1-9]\d)|([6-9]|[1-9]\d)(\.\d+)?)(?![\d.])")


def takes_breakpoints(model: Any) -> bool:
    """Whether the OpenAI model `model` takes `prompt_cache_breakpoint` on content parts."""
    return bool(_EXPLICIT.match(str(model or "")))


def breakpoints_travel(target: str, model: Any) -> bool:
    """Whether a Responses request's explicit breakpoints (on input parts) go on to `target`: to Claude as its
    cache_control, to a Chat model that takes them as they are."""
    return target.startswith("Anthropic") or takes_breakpoints(model)


def options_travel(target: str, model: Any) -> bool:
    """Whether a Responses request's prompt_cache_options go on to `target`: to a Chat model that takes them, as they
    are; Claude has no cache mode (its breakpoints are the planner's and the client's)."""
    return not target.startswith("Anthropic") and takes_breakpoints(model)


# A Responses request's `prompt_cache_options.comparison_response_id` (openai 3.x) asks OpenAI why the prompt cache was or
# was not reused against an earlier response: the response's `prompt_cache_diagnostics`, whose `unavailable` says "no
# diagnosis". Chat's prompt_cache_options has no such field, and a translated target has no earlier response to compare
# with: it is not sent, and the answer says `unavailable`, as a Messages client's `diagnostics` is answered (bodies.py).
COMPARED = "comparison_response_id"


def chat_options(options: Any) -> Any:
    """A Responses request's prompt_cache_options as Chat's (mode, ttl): without comparison_response_id."""
    return {key: value for key, value in options.items() if key != COMPARED} if isinstance(options, dict) else options


def diagnostics(request: dict[str, Any]) -> dict[str, Any]:
    """The `prompt_cache_diagnostics` a translated Responses answer gives `request`: `unavailable` where it asked."""
    options = request.get("prompt_cache_options")
    return {"prompt_cache_diagnostics": {"type": "unavailable"}} if isinstance(options, dict) and options.get(COMPARED) else {}


def openai_breakpoint(cache_control: Any) -> dict[str, Any] | None:
    """Claude's `cache_control` as OpenAI's breakpoint. A 1-hour marker asks OpenAI's 12h, the one lifetime that
    outlasts an hour; a 5-minute one takes the request's (30 minutes)."""
    if not isinstance(cache_control, dict):
        return None
    return {"mode": "explicit", **({"ttl": "12h"} if cache_control.get("ttl") == "1h" else {})}


def marked_part(part: dict[str, Any], *blocks: Any) -> dict[str, Any]:
    """`part` with the breakpoint of the first of `blocks` (Claude blocks it was made from) that has a marker."""
    marker = next((b.get("cache_control") for b in blocks if isinstance(b, dict) and b.get("cache_control") is not None), None)
    breakpoint_ = openai_breakpoint(marker)
    return {**part, BREAKPOINT: breakpoint_} if breakpoint_ else part


def system_parts(blocks: list[Any], text: str) -> str | list[dict[str, Any]]:
    """A Messages system prompt (`text`, its blocks joined by blank lines) as a Chat system message's content: the
    text, or, where a block carries a marker, text parts that join to the same text, each marked as its block was."""
    if not any(isinstance(b, dict) and b.get("cache_control") is not None for b in blocks):
        return text
    return [marked_part({"type": "text", "text": ("\n\n" if i else "") + b["text"]}, b) for i, b in enumerate(blocks)]


def in_responses_input(items: Any) -> bool:
    """Whether a Responses `input` carries an explicit breakpoint on a message's or a function output's part."""
    for item in items if isinstance(items, list) else ():
        parts = (item.get("content") or item.get("output")) if isinstance(item, dict) else None
        if isinstance(parts, list) and any(isinstance(p, dict) and isinstance(p.get(BREAKPOINT), dict) for p in parts):
            return True
    return False


def unmarked(messages: list[dict[str, Any]]) -> None:
    """Takes the breakpoints off a translated Chat body's own parts (for a model that takes none)."""
    for message in messages:
        for part in _parts(message):
            part.pop(BREAKPOINT, None)
