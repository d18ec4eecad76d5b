"""Responses tool search across a translation.

A Responses request may defer tools and offer `{"type": "tool_search"}` to load them as needed. Codex
(0.144 and later) always does so for its MCP tools, with the search run by the client
(`"execution": "client"`): the model calls the tool search with arguments the client's `parameters`
describe (a `tool_search_call` item), the client searches its own catalogue and answers with a
`tool_search_output` item whose `tools` are offered from then on. A Chat or Claude target has no such
tool, so:

- a client-run tool search goes as a function tool named `tool_search` (its description and
  parameters as the client wrote them, client_tools.py); the upstream's calls of it come back as
  `tool_search_call` items, and the history's calls and outputs go as that function's calls and
  results, the result naming the tools it loaded, which are sent as tools of their own (here);
- a search run by the provider (`"execution": "server"`, OpenAI's default) has no counterpart: it is
  left out (named `tools.tool_search`) and the deferred tools go from the start, as they are in the
  request's tools; the history's server-run searches hold nothing another model reads, and are left out.

The same holds the other way: a Messages request's Anthropic tool search server tool
(`tool_search_tool_regex_*`, `tool_search_tool_bm25_*`) reaches an OpenAI target left out and named, its
deferred tools offered from the start, and the history's searches (`server_tool_use` of it and its
`tool_search_tool_result`) left out.
"""

from __future__ import annotations

from typing import Any

TOOL_SEARCH = "tool_search"  # the function a client-run search goes as
_LOADED_ANSWER = "Tools loaded: "


_CLAUDE_SEARCH = "tool_search_tool_"  # Anthropic's tool search: its tools' types, its server_tool_use names


def claude_tool_search(tool: Any) -> bool:
    """Whether `tool` is Anthropic's tool search server tool (regex or BM25), which loads `defer_loading` tools.
    An OpenAI target has no such tool: it is left out (named), and the deferred tools are offered from the start."""
    return isinstance(tool, dict) and str(tool.get("type")).startswith(_CLAUDE_SEARCH)


def claude_search_block(block: dict[str, Any]) -> bool:
    """Whether an assistant block is one of Anthropic's tool searches (its call or its result), which holds
    nothing an OpenAI model reads: that model has every tool from the start."""
    return block.get("type") == "tool_search_tool_result" or (
        block.get("type") == "server_tool_use" and str(block.get("name")).startswith(_CLAUDE_SEARCH))


def by_client(entry: Any) -> bool:
    return isinstance(entry, dict) and entry.get("execution") == "client"


def is_search(tool: Any) -> bool:
    return isinstance(tool, dict) and tool.get("type") == TOOL_SEARCH


def dropped(tools: Any) -> list[str]:
    """`tools.tool_search` when a Responses request offers a search run by the provider, `tools.TYPE` for a
    Messages request's Anthropic tool search: left out, and named."""
    if not isinstance(tools, list):
        return []
    return ([f"tools.{TOOL_SEARCH}"] if any(is_search(t) and not by_client(t) for t in tools) else []) + \
        [f"tools.{t['type']}" for t in tools if claude_tool_search(t)]


def _adds_tools(item: dict[str, Any]) -> bool:
    """An input item that offers tools from its place on: a client-run search's output, or `additional_tools`."""
    return (item.get("type") == "tool_search_output" and by_client(item)) or item.get("type") == "additional_tools"


def offered_tools(body: dict[str, Any]) -> Any:
    """The tools a translated request offers: its own (less a provider-run search), then those its client-run
    searches loaded (`tool_search_output` items) and its `additional_tools` items add, each name once: a Chat or
    Claude request offers its tools from the start."""
    tools, items = body.get("tools"), body.get("input")
    if tools is not None and not isinstance(tools, list):
        return tools  # the client's error, which namespaces.flattened names
    loaded = [tool for item in items if isinstance(item, dict) and _adds_tools(item) and isinstance(item.get("tools"), list)
              for tool in item["tools"]] if isinstance(items, list) else []
    out, names = [], set()
    for tool in [*(tools or ()), *loaded]:
        if is_search(tool) and not by_client(tool):
            continue
        name = tool.get("name") if isinstance(tool, dict) else None
        if name is None or name not in names:
            out.append(tool)
            names.add(name)
    return out


def output_text(names: list[str]) -> str:
    """A history `tool_search_output` as its call's result: the names (as the upstream knows them) of the tools
    it loaded, which are sent as tools."""
    return _LOADED_ANSWER + ", ".join(names) if names else "No tools found."
