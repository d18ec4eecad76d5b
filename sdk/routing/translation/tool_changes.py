"""Claude's mid-conversation tool changes, for an OpenAI model.

A Messages conversation can change the tools it offers without changing `tools` (which would miss Claude's prompt
cache): a `tool_addition` block makes a tool available from its place in the conversation on (`tool_reference`, a tool
of `tools` or one defined earlier, or `tool_definition`, a `tools` entry by value), a `tool_removal` block withdraws one
(inline-tools beta). The anthropic SDK's tool runner sends them, in `role: "system"` messages, for its `add_tools()`
and `remove_tools()`, and a `compaction` block's `tool_changes` are the same blocks for the turns it summarized
(compaction.claude_compacted puts them where the summary is).

An OpenAI model is offered its tools for the whole request: it is sent the tools in effect at the conversation's end,
`tools` with each change applied in order (a definition in place of a tool of its name; a withdrawn tool left out,
unless added again), and the change blocks are left out of the messages (a message of nothing else with them). What
it can call is what Claude could call at the end; the history's calls of a withdrawn tool stay as they were. MCP
references (the MCP connector's tools, which an OpenAI target has not) are refused, naming them.

The OpenAI model's prompt renders its tools first, so a change reads none of the conversation from its prompt cache
once (the request after it writes it again), where Claude reads on: the cost of a target without such blocks.
"""

from __future__ import annotations

from typing import Any

from sdk.routing.translation.fields import refuse

KINDS = ("tool_addition", "tool_removal")


def applied(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with its tool changes applied to `tools` and left out of `messages`; `body` itself where it has none."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not any(_changes(message) for message in messages):
        return body
    tools = {_name(tool): tool for tool in body.get("tools") or () if isinstance(tool, dict)}
    known = dict(tools)  # every tool a reference can name: the request's and those defined on the way
    kept: list[Any] = []
    for i, message in enumerate(messages):
        changes = _changes(message)
        for j, block in changes:
            tool = block.get("tool")
            tool = tool if isinstance(tool, dict) else {}
            where = f"messages.{i}.content.{j}.tool"
            if tool.get("type") == "tool_definition" and isinstance(tool.get("definition"), dict) and block["type"] == KINDS[0]:
                definition = tool["definition"]
                known[_name(definition)] = tools[_name(definition)] = definition
            elif tool.get("type") == "tool_reference" and isinstance(tool.get("name"), str):
                if block["type"] == KINDS[1]:
                    tools.pop(tool["name"], None)
                elif tool["name"] in known:
                    tools[tool["name"]] = known[tool["name"]]
            else:
                raise refuse(f"{where}: a {tool.get('type')!r} (the MCP connector's tools, which the target has not)", "OpenAI")
        if not changes:
            kept.append(message)
            continue
        rest = [block for j, block in enumerate(message["content"]) if j not in {k for k, _ in changes}]
        if rest:
            kept.append({**message, "content": rest})
    out = {**body, "messages": kept}
    if tools or body.get("tools") is not None:
        out["tools"] = list(tools.values())
    return out


def _changes(message: Any) -> list[tuple[int, dict[str, Any]]]:
    content = message.get("content") if isinstance(message, dict) else None
    return [(j, block) for j, block in enumerate(content) if isinstance(block, dict) and block.get("type") in KINDS] \
        if isinstance(content, list) else []


def _name(tool: dict[str, Any]) -> Any:
    return tool.get("name") or tool.get("type")
