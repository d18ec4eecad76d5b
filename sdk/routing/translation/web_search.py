"""Web search across the dialects: OpenAI's hosted web search as Claude's web search server tool.

The two do the same: the model decides to look something up, the provider runs the search, and the answer
cites the pages it used. So
- a Responses `web_search` tool (`web_search_preview`, and their dated names: Codex's, the Agents SDK's
  WebSearchTool, the Vercel AI SDK's openai.tools.webSearch) reaches a Claude target as Chat's
  `web_search_options` on the way (responses_requests.py), and Chat's `web_search_options` reach Claude as
  the `web_search_20250305` server tool: `user_location` carried, `filters.allowed_domains` as
  `allowed_domains`; `search_context_size` (how much of each page OpenAI reads) has no counterpart and is
  dropped, named (fields.py);
- Claude's answer cites with `web_search_result_location` citations on its text blocks: they reach a Chat
  client as the message's `url_citation` annotations (start and end index over the text; streamed, in a
  chunk's `delta.annotations` when the cited block ends), a Responses client as its output_text's
  `url_citation` annotations (streamed, `response.output_text.annotation.added`). The search's own blocks (`server_tool_use`,
  `web_search_tool_result`) carry encrypted results only Claude can read: they are left out, and a Responses
  client's `web_search_call` items sent back in a later turn are left out too (the answer's text and
  citations carry what was found).
A Chat Completions target keeps refusing the Responses tool: only OpenAI's search models take
web_search_options, and a Chat upstream's model is not known to be one.
"""

from __future__ import annotations

from typing import Any

from sdk.routing.translation.fields import refuse

# The Responses API's hosted web search tools.
RESPONSES_TOOLS = ("web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11")
CLAUDE_TOOL = "web_search_20250305"  # every Claude model with web search takes this version
_LOCATION = ("city", "region", "country", "timezone")


def options_of(tool: dict[str, Any]) -> dict[str, Any]:
    """A Responses web search tool as Chat's web_search_options (with its domain filter, which Claude takes)."""
    out: dict[str, Any] = {}
    location = tool.get("user_location")
    if isinstance(location, dict):
        out["user_location"] = {"type": "approximate", "approximate": {k: location[k] for k in _LOCATION if location.get(k)}}
    for key in ("search_context_size", "filters"):
        if tool.get(key) is not None:
            out[key] = tool[key]
    return out


def claude_tool(options: Any) -> dict[str, Any]:
    """Chat's web_search_options as Claude's web search server tool."""
    if not isinstance(options, dict):
        raise refuse("web_search_options that is not an object", "Anthropic")
    tool: dict[str, Any] = {"type": CLAUDE_TOOL, "name": "web_search"}
    location = (options.get("user_location") or {}).get("approximate")
    if isinstance(location, dict) and any(location.get(k) for k in _LOCATION):
        tool["user_location"] = {"type": "approximate", **{k: location[k] for k in _LOCATION if location.get(k)}}
    domains = (options.get("filters") or {}).get("allowed_domains")
    if domains:
        tool["allowed_domains"] = list(domains)
    return tool


def annotations_a2o(blocks: list[dict[str, Any]], offset: int, end: int) -> list[dict[str, Any]]:
    """Claude's web search citations on `blocks` (the answer's text blocks, in order) as Chat's url_citation
    annotations over the joined text: each spans its block, shifted by `offset` (a prefill before the text),
    those past `end` (the text was cut there) left out."""
    out: list[dict[str, Any]] = []
    start = offset
    for block in blocks:
        stop = start + len(block.get("text") or "")
        if stop <= end:
            out += url_citations(block.get("citations"), start, stop)
        start = stop
    return out


def url_citations(citations: Any, start: int, stop: int) -> list[dict[str, Any]]:
    """Claude's web search citations of one text block (the answer's characters `start` to `stop`) as Chat's
    url_citation annotations; citations of other kinds (a document's) are not a web search's."""
    return [{"type": "url_citation", "url_citation": {"start_index": start, "end_index": stop, "url": citation.get("url"),
                                                      "title": citation.get("title")}}
            for citation in citations or () if isinstance(citation, dict) and citation.get("type") == "web_search_result_location"]


def annotations_c2r(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A Chat message's (or a streamed delta's) url_citation annotations as a Responses output_text's."""
    out = []
    for annotation in message.get("annotations") or ():
        cited = annotation.get("url_citation") if isinstance(annotation, dict) else None
        if isinstance(cited, dict):
            out.append({"type": "url_citation", "start_index": cited.get("start_index"), "end_index": cited.get("end_index"),
                        "url": cited.get("url"), "title": cited.get("title")})
    return out
