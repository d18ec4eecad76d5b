"""Web search across the dialects: OpenAI's hosted web search as Claude's web search server tool.

The two do the same: the model decides to look something up, the provider runs the search, and the answer
cites the pages it used. So
- a Responses `web_search` tool (`web_search_preview`, and their dated names: Codex's, the Agents SDK's
  WebSearchTool, the Vercel AI SDK's openai.tools.webSearch) reaches a Claude target as Chat's
  `web_search_options` on the way (responses_requests.py), and Chat's `web_search_options` reach Claude as
  the `web_search_20250305` server tool: `user_location` carried, `filters.allowed_domains` as
  `allowed_domains`; `search_context_size` (how much of each page OpenAI reads) has no counterpart and is
  dropped, named (fields.py). Its `max_uses` is the Responses request's `max_tool_calls` (its limit on built-in
  tools' calls, web search the only one that reaches Claude), else DEFAULT_SEARCHES: Claude's tool without one searches
  as often as its loop runs (and a paused turn, resumed by the gateway, runs it again), each search billed, where the
  budget's hold assumed DEFAULT_SEARCHES (sdk/estimate.py:search_limit) and OpenAI's Chat search runs one a request;
  `max_tool_calls: 0` (no built-in calls) offers Claude no search;
- Claude's answer cites with `web_search_result_location` citations on its text blocks: they reach a Chat
  client as the message's `url_citation` annotations (start and end index over the text; streamed, in a
  chunk's `delta.annotations` when the cited block ends), a Responses client as its output_text's
  `url_citation` annotations (streamed, `response.output_text.annotation.added`). The search's own blocks (`server_tool_use`,
  `web_search_tool_result`) of a Claude answer are not sent to the Chat client (its answer is the text and citations);
  for a Responses client each search is a `web_search_call` output item before the message (the Agents SDK's
  WebSearchCall items, which its runs and traces read), as OpenAI's answer has it: `action: {type: "search", query}`,
  `failed` where Claude's result is a `web_search_tool_result_error`; no `sources` (`include:
  ["web_search_call.action.sources"]` stays dropped, named). The Chat answer between carries them under the gateway's
  own ITEMS key, which only the Chat request made from a Responses one asks for (its web_search_options' ITEMS);
  streamed, each goes in a chunk of its own when its result starts, and the Responses stream sends the item's added,
  in_progress, searching, completed and done events at once.
- a conversation's earlier searches, sent to a model of the other provider (after a model switch, or on a fallback),
  are context that model should still see: what was searched and which pages were found. Each is carried as text in
  the assistant turn where it happened (`history_text`), for either provider: Claude's `server_tool_use` of
  web_search / web_fetch and their `web_search_tool_result` / `web_fetch_tool_result` (a result's page content is
  encrypted for Claude: its title, URL and age are sent; a fetched text document's text too) to an OpenAI model; a
  Responses `web_search_call` item (its query and the sources OpenAI lists) to a Chat or Claude model. Left out, the
  model would read an answer built on sources it was never shown, and could not say where a claim came from.
A Chat Completions target keeps refusing the Responses tool: only OpenAI's search models take
web_search_options, and a Chat upstream's model is not known to be one.
"""

from __future__ import annotations

from typing import Any

from sdk.estimate import DEFAULT_SEARCHES
from sdk.routing.translation.fields import WEB_SEARCH_TOOLS, refuse

RESPONSES_TOOLS = WEB_SEARCH_TOOLS  # the Responses API's hosted web search tools
CLAUDE_TOOL = "web_search_20250305"  # every Claude model with web search takes this version
_LOCATION = ("city", "region", "country", "timezone")


# The gateway's own key, in a Chat request's web_search_options and its answer's message (a stream's delta): the searches
# Claude ran, for the Responses answer made of it.
ITEMS = "slipstream_web_search_calls"


def options_of(tool: dict[str, Any], limit: Any = None) -> dict[str, Any]:
    """A Responses web search tool as Chat's web_search_options (with its domain filter, which Claude takes); `limit`, the
    request's `max_tool_calls`, as the gateway's own `max_uses` in them (read by `claude_tool` only: the body goes to Claude);
    ITEMS: the answer is to carry the searches (for their web_search_call items)."""
    out: dict[str, Any] = {ITEMS: True, **({"max_uses": limit} if _uses(limit) else {})}
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
    uses = options.get("max_uses")
    tool: dict[str, Any] = {"type": CLAUDE_TOOL, "name": "web_search", "max_uses": uses if _uses(uses) else DEFAULT_SEARCHES}
    location = (options.get("user_location") or {}).get("approximate")
    if isinstance(location, dict) and any(location.get(k) for k in _LOCATION):
        tool["user_location"] = {"type": "approximate", **{k: location[k] for k in _LOCATION if location.get(k)}}
    domains = (options.get("filters") or {}).get("allowed_domains")
    if domains:
        tool["allowed_domains"] = list(domains)
    return tool


def _uses(limit: Any) -> bool:
    """Whether `limit` is a number of searches Claude takes as `max_uses` (a positive integer)."""
    return isinstance(limit, int) and not isinstance(limit, bool) and limit > 0


def searches_asked(body: dict[str, Any]) -> bool:
    """Whether a Chat request's answer is to carry Claude's searches (made from a Responses request: ITEMS)."""
    options = body.get("web_search_options")
    return isinstance(options, dict) and options.get(ITEMS) is True


def searched(call: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """One of Claude's web searches (its server_tool_use, its web_search_tool_result) as the answer carries it."""
    content = result.get("content")
    failed = isinstance(content, dict) and str(content.get("type")).endswith("_error")
    return {"query": _obj(call.get("input")).get("query"), "failed": failed}


def claude_searches(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The web searches in a Claude answer's `blocks` that have their result, in order (`searched`)."""
    calls = {b.get("id"): b for b in blocks if b.get("type") == "server_tool_use" and b.get("name") == "web_search"}
    return [searched(calls[b.get("tool_use_id")], b) for b in blocks
            if b.get("type") == "web_search_tool_result" and b.get("tool_use_id") in calls]


def search_item(search: dict[str, Any], item_id: str) -> dict[str, Any]:
    """A search the answer carries (`searched`) as a Responses web_search_call output item."""
    return {"id": item_id, "type": "web_search_call", "status": "failed" if search.get("failed") else "completed",
            "action": {"type": "search", "query": search.get("query") or ""}}


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


# --- earlier searches, as text for a model of the other provider ----------------------------------------------------

_CLAUDE_SEARCHES = ("web_search", "web_fetch")  # the server tools whose use is carried as text
_CLAUDE_RESULTS = ("web_search_tool_result", "web_fetch_tool_result")


def claude_search_history(block: dict[str, Any]) -> bool:
    """Whether an assistant block is Claude's web search or fetch: its call or its result."""
    kind = block.get("type")
    return kind in _CLAUDE_RESULTS or (kind == "server_tool_use" and block.get("name") in _CLAUDE_SEARCHES)


def history_text(block: dict[str, Any]) -> str:
    """Claude's web search or fetch block as the text a model of the other provider reads in its place."""
    kind, given = block.get("type"), _obj(block.get("input"))
    if kind == "server_tool_use":
        if block.get("name") == "web_fetch":
            return f"[Fetched {given.get('url')}]"
        return f"[Searched the web for: {given.get('query')}]"
    content = block.get("content")
    if isinstance(content, dict) and str(content.get("type")).endswith("_error"):
        return f"[The {'fetch' if kind == 'web_fetch_tool_result' else 'search'} failed: {content.get('error_code')}]"
    if kind == "web_fetch_tool_result" and isinstance(content, dict):
        document = _obj(content.get("content"))
        source = _obj(document.get("source"))
        title = f" ({document['title']})" if document.get("title") else ""
        text = f"\n{source['data']}" if source.get("type") == "text" and isinstance(source.get("data"), str) else ""
        return f"[Page {content.get('url')}{title}]{text}"
    found = [r for r in content if isinstance(r, dict) and r.get("url")] if isinstance(content, list) else []
    return _found([(r.get("title"), r["url"], r.get("page_age")) for r in found])


def responses_history_text(item: dict[str, Any]) -> str:
    """A Responses `web_search_call` item as the text a Chat or Claude model reads in its place: its query (or the page
    it opened or searched in) and the sources OpenAI lists with it (with `include: web_search_call.action.sources`)."""
    action = _obj(item.get("action"))
    if action.get("type") == "open_page":
        return f"[Opened {action.get('url')}]"
    if action.get("type") == "find_in_page":
        return f"[Searched {action.get('url')} for: {action.get('pattern')}]"
    listed = action.get("queries")
    queries: list[Any] = listed if isinstance(listed, list) else [action.get("query")]
    asked = "; ".join(str(q) for q in queries if q)
    sources = [s["url"] for s in action.get("sources") or () if isinstance(s, dict) and s.get("url")]
    searched = f"[Searched the web for: {asked}]" if asked else "[Searched the web]"
    return searched + ("\n" + _found([(None, url, None) for url in sources]) if sources else "")


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _found(results: list[tuple[Any, str, Any]]) -> str:
    lines = [f"- {f'{title}: ' if title else ''}{url}{f' ({age})' if age else ''}" for title, url, age in results]
    return "[Results:]\n" + "\n".join(lines) if lines else "[No results]"

