"""Responses namespace tools across a translation.

openai 3.x groups function and custom tools under a namespace (`{"type": "namespace", "name", "description",
"tools"}`; Codex groups its collaboration tools and each MCP app's tools so), and their calls come back as
`function_call` / `custom_tool_call` items naming the tool and its `namespace`. Chat Completions and Claude
have flat tool lists: each tool of a namespace goes as a tool of its own named `NAMESPACE__NAME` (letters,
digits, `_` and `-`, as both take), its description saying which namespace it belongs to; the history's calls
of it go by that name, and the upstream's calls of it come back as the tool's name and its namespace.
"""

from __future__ import annotations

from typing import Any

from sdk.routing.translation.tool_search import offered_tools

SEPARATOR = "__"


def flattened(tools: Any) -> list[Any]:
    """`tools` with each namespace tool replaced by its tools, named and described as above (others as they are).
    Anything but an array (or nothing) is the client's error: a TypeError, which the translator answers with a 400."""
    if not tools:
        return []
    if not isinstance(tools, list):
        raise TypeError(f"tools: expected an array of tools, not {type(tools).__name__}")
    out: list[Any] = []
    for tool in tools:
        if not (isinstance(tool, dict) and tool.get("type") == "namespace"):
            out.append(tool)
            continue
        namespace, about = tool.get("name"), tool.get("description") or ""
        for inner in tool.get("tools") or ():
            if not isinstance(inner, dict):
                out.append(inner)  # refused by the tool translation, naming it
                continue
            description = "\n\n".join(part for part in (inner.get("description"), f"(A tool of {namespace}: {about})") if part)
            out.append({**inner, "name": joined(namespace, inner.get("name")), "description": description})
    return out


def joined(namespace: Any, name: Any) -> str:
    return f"{namespace}{SEPARATOR}{name}"


def call_name(item: dict[str, Any]) -> Any:
    """The name an input item's call goes by upstream: a namespaced tool's joined name."""
    return joined(item["namespace"], item.get("name")) if item.get("namespace") else item.get("name")


def namespaced(request: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Joined name → (namespace, name) for every tool of `request`'s namespaces (a client-run tool search's too)."""
    return {joined(tool.get("name"), inner.get("name")): (str(tool.get("name")), str(inner.get("name")))
            for tool in _listed(offered_tools(request)) if isinstance(tool, dict) and tool.get("type") == "namespace"
            for inner in tool.get("tools") or () if isinstance(inner, dict)}


def _listed(tools: Any) -> list[Any]:
    return tools if isinstance(tools, list) else []


def as_called(item: dict[str, Any], names: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """A call item of the answer with the client's tool name and its namespace, if the upstream called a namespaced one."""
    known = names.get(str(item.get("name")))
    if known is None:
        return item
    namespace, name = known
    return {**item, "name": name, "namespace": namespace}
