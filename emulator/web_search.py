"""Anthropic's web search server tool (`web_search_20250305`, `web_search_20260209`) as the emulator runs it.

A request whose `tools` hold the tool (and whose tool_choice is not `none`) gets one search before the answer,
as Claude answers a question it looks up: a `server_tool_use` block (`srvtoolu_…`, `input: {query}`), its
`web_search_tool_result` (results with url, title, encrypted_content, page_age), then the answer's text citing
the first result (`citations: [{type: web_search_result_location, url, title, encrypted_index, cited_text}]`);
usage counts it in `server_tool_use.web_search_requests`. Streamed, the server_tool_use's input arrives as
`input_json_delta`, the result block whole in its `content_block_start`, and the citation as a `citations_delta`
before the text (Anthropic's streaming docs, web search tool docs).
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

VERSIONS = ("web_search_20250305", "web_search_20260209")


def web_search_tool(body: dict[str, Any]) -> dict[str, Any] | None:
    """The request's web search tool, when the model may use it."""
    tool = next((t for t in body.get("tools") or () if isinstance(t, dict) and t.get("type") in VERSIONS), None)
    choice = body.get("tool_choice")
    return None if tool is None or (isinstance(choice, dict) and choice.get("type") == "none") else tool


def tool_problem(tool: dict[str, Any], where: str) -> str | None:
    """What the API refuses in a web search tool definition, or None."""
    if tool.get("name") != "web_search":
        return f"{where}.name: Input should be 'web_search'"
    if tool.get("allowed_domains") and tool.get("blocked_domains"):
        return f"{where}: cannot specify both allowed_domains and blocked_domains"
    location = tool.get("user_location")
    if location is not None and (not isinstance(location, dict) or location.get("type") != "approximate"):
        return f"{where}.user_location.type: Input should be 'approximate'"
    return None


def _query(body: dict[str, Any], most: int = 60) -> str:
    """What the model looks up: the start of the user's last text (its first `most` characters)."""
    for message in reversed(body.get("messages") or ()):
        content = message.get("content") if isinstance(message, dict) and message.get("role") == "user" else None
        texts = [content] if isinstance(content, str) else [b.get("text", "") for b in content or () if isinstance(b, dict) and b.get("type") == "text"]
        text = " ".join(t for t in texts if t).strip()
        if text:
            return text[:most]
    return "latest news"


PAUSED_OUTPUT_TOKENS = 8  # a paused turn's output: the search's call
_PAUSING = "search at length"


def pauses(body: dict[str, Any]) -> bool:
    """A turn whose user asks to "search at length" pauses after its search (stop_reason `pause_turn`, the server
    tool loop's long-running turn), for the caller to send it back as it is."""
    return _PAUSING in _query(body, 10_000).lower()


def resumes_paused_turn(body: dict[str, Any]) -> bool:
    """The request sends a paused turn back (its last message the assistant's, ending with a search's result): the
    turn goes on from there, to its answer, without searching again."""
    last = (body.get("messages") or [{}])[-1]
    content = last.get("content") if isinstance(last, dict) and last.get("role") == "assistant" else None
    return isinstance(content, list) and bool(content) and isinstance(content[-1], dict) and \
        str(content[-1].get("type", "")).endswith("_tool_result")


def _opaque(label: str) -> str:
    return base64.b64encode(hashlib.blake2b(label.encode(), digest_size=24).digest()).decode()


def searched(body: dict[str, Any], tool: dict[str, Any], blocks: list[dict[str, Any]], tool_id: str) -> list[dict[str, Any]]:
    """`blocks` (the answer) after one search: the server_tool_use, its result, the text citing the first result."""
    query = _query(body)
    domain = (tool.get("allowed_domains") or ["example.org"])[0]
    results = [{"type": "web_search_result", "url": f"https://{domain}/{n}/{hashlib.md5(query.encode()).hexdigest()[:8]}",
                "title": f"{query} ({n})", "encrypted_content": _opaque(f"{query}:{n}"), "page_age": "April 30, 2026"}
               for n in (1, 2)]
    out: list[dict[str, Any]] = [{"type": "server_tool_use", "id": tool_id, "name": "web_search", "input": {"query": query}},
                                 {"type": "web_search_tool_result", "tool_use_id": tool_id, "content": results}]
    for block in blocks:
        if block["type"] == "text" and not any(b["type"] == "text" for b in out):
            first = results[0]
            block = dict(block, citations=[{"type": "web_search_result_location", "url": first["url"], "title": first["title"],
                                            "encrypted_index": _opaque(first["url"]), "cited_text": block["text"][:80]}])
        out.append(block)
    return out
