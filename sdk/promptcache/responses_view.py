"""A native Responses body seen as Chat Completions messages, so the optimizer can plan it.

OpenAI caches a Responses prompt the way it caches a Chat one: by exact prefix (instructions, then
the input items in order), routed by `prompt_cache_key`. The optimizer reads Chat bodies, so a
Responses body is planned through a Chat-shaped view of it: the instructions as a system message,
each input item as one message. What the plan decides is carried back onto the real body: the
gateway's `prompt_cache_key` and, under `isolate`, the team's salt leading the instructions. The
view is never sent; nothing else of it is carried back (no moved lines, no canonical schemas).
"""

from __future__ import annotations

from typing import Any

import orjson

from sdk.types import Endpoint, LLMRequest


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") if isinstance(part, dict) and isinstance(part.get("text"), str)
                       else orjson.dumps(part).decode() for part in content)
    return orjson.dumps(content).decode()


def _message(item: Any) -> dict[str, Any]:
    """One input item as a message: its role and text, or (a tool call, its output, a reference) the
    item itself, serialized, so the view's prefix changes exactly where the real one does."""
    if isinstance(item, dict) and item.get("type", "message") == "message" and isinstance(item.get("role"), str):
        return {"role": item["role"], "content": _text(item.get("content"))}
    return {"role": "user", "content": orjson.dumps(item).decode()}


def plannable(body: dict[str, Any]) -> bool:
    """The shapes the view reads; anything else goes upstream unplanned, for the provider to judge."""
    return (isinstance(body.get("input"), (str, list)) and isinstance(body.get("instructions") or "", str)
            and isinstance(body.get("tools", []), list))


def chat_view(request: LLMRequest) -> LLMRequest:
    body = request.body
    instructions = body.get("instructions") or ""
    items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + [_message(i) for i in items]
    view = {"model": body.get("model"), "messages": messages, "tools": body.get("tools") or []}
    if body.get("prompt_cache_key"):
        view["prompt_cache_key"] = body["prompt_cache_key"]
    return LLMRequest(Endpoint.CHAT_COMPLETIONS, view, request.forward_headers, request.query, request.size)


def carry_back(request: LLMRequest, view: dict[str, Any], original_view: dict[str, Any]) -> LLMRequest:
    """`request` with what planning its view added: the cache key, and a salt message put in front."""
    body = dict(request.body)
    if view.get("prompt_cache_key") and not body.get("prompt_cache_key"):
        body["prompt_cache_key"] = view["prompt_cache_key"]
    added = len(view["messages"]) - len(original_view["messages"])
    if added > 0:  # the salt (keys.salted): a system message ahead of the others, so ahead of the instructions
        salt = "\n".join(_text(m.get("content")) for m in view["messages"][:added])
        instructions = body.get("instructions") or ""
        body["instructions"] = f"{salt}\n\n{instructions}" if instructions else salt
    return LLMRequest(request.endpoint, body, request.forward_headers, request.query, request.size)
