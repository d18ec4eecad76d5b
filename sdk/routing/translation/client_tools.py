"""OpenAI's built-in tools that the client runs, across a translation to Claude or a Chat model.

The model calls such a tool with an item of the tool's own (`tool_search_call`, `shell_call`,
`apply_patch_call`); the client runs it and answers with the tool's output item. A Chat or Claude target
has function tools only, so each goes as a function named as the tool, taking what its call item holds;
the upstream's calls of it come back as the tool's call items (whole, as OpenAI streams them: no argument
events), and the history's call and output items go as that function's calls and results.

- `tool_search` run by the client (Codex's, for its MCP tools): the client's description and parameters;
  the tools its output loads are offered from then on (tool_search.py).
- `shell` in a local environment (the OpenAI Agents SDK's ShellTool; a container is OpenAI's to run):
  commands, a timeout and an output limit; the result is each command's stdout, stderr and exit.
- `apply_patch` (the Agents SDK's ApplyPatchTool): one operation, a file created, updated or deleted, with
  its path and (but for a deletion) a V4A diff; the result is the client's status and output.

A function of the client's own named as one of these, beside it, is refused: their calls could not be
told apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jiter
import orjson

from sdk.routing.translation.namespaces import flattened
from sdk.routing.translation.tool_search import TOOL_SEARCH, by_client, output_text


@dataclass(frozen=True, slots=True)
class ClientTool:
    kind: str  # the tool's type, the function's name
    call: str  # its call item's type
    output: str  # its output item's type
    field: str  # the call item's field holding what the function's arguments hold
    description: str  # the function's, where the tool gives none
    parameters: dict[str, Any]  # the function's, where the tool gives none


_SHELL = ClientTool(
    "shell", "shell_call", "shell_call_output", "action",
    "Run shell commands in the user's environment, in order; each one's stdout, stderr and exit code come back.",
    {"type": "object", "properties": {
        "commands": {"type": "array", "items": {"type": "string"}, "description": "The commands to run, in order."},
        "timeout_ms": {"type": "integer", "description": "How long the commands may run, in milliseconds."},
        "max_output_length": {"type": "integer", "description": "At most this many characters of output come back."}},
     "required": ["commands"]})
_APPLY_PATCH = ClientTool(
    "apply_patch", "apply_patch_call", "apply_patch_call_output", "operation",
    "Create, update or delete one file. For create_file, `diff` is the new file's content, each line prefixed with "
    "'+'. For update_file, `diff` is a V4A diff of the file: one or more hunks, each starting with a line '@@' (or "
    "'@@ ' and a line of the file that locates it), then the hunk's lines, each prefixed with ' ' (context, about "
    "three lines around each change), '-' (removed) or '+' (added). For delete_file, an empty diff.",
    {"type": "object", "properties": {
        "type": {"type": "string", "enum": ["create_file", "update_file", "delete_file"]},
        "path": {"type": "string", "description": "The file's path, relative to the workspace."},
        "diff": {"type": "string", "description": "The diff, as described (empty for delete_file)."}},
     "required": ["type", "path", "diff"]})
_SEARCH = ClientTool(TOOL_SEARCH, "tool_search_call", "tool_search_output", "arguments",
                     "Search for tools to load, and load those found.", {"type": "object", "properties": {}})
_TOOLS = {tool.kind: tool for tool in (_SHELL, _APPLY_PATCH, _SEARCH)}
CALLS = {tool.call: tool for tool in _TOOLS.values()}
OUTPUTS = {tool.output: tool for tool in _TOOLS.values()}


def of(tool: Any) -> ClientTool | None:
    """The client tool `tool` offers (None: a function or other tool, a search the provider runs, a shell
    in OpenAI's container)."""
    if not isinstance(tool, dict):
        return None
    found = _TOOLS.get(str(tool.get("type")))
    if found is _SEARCH and not by_client(tool):
        return None
    environment = tool.get("environment")
    if found is _SHELL and isinstance(environment, dict) and environment.get("type") != "local":
        return None
    return found


def run_by_client(request: dict[str, Any]) -> dict[str, ClientTool]:
    """The client tools `request` offers, by the name their functions go by."""
    tools = request.get("tools")
    return {found.kind: found for tool in tools if (found := of(tool)) is not None} if isinstance(tools, list) else {}


def function(tool: dict[str, Any], found: ClientTool) -> dict[str, Any]:
    """The tool as the Chat function the upstream calls (a client-run search with the client's own words)."""
    return {"type": "function", "function": {"name": found.kind, "description": tool.get("description") or found.description,
                                             "parameters": tool.get("parameters") or found.parameters}}


def call_item(found: ClientTool, item_id: str, call_id: str, arguments: Any, status: str = "completed") -> dict[str, Any]:
    """The upstream's call of the tool's function as the tool's call item."""
    if found is _APPLY_PATCH and isinstance(arguments, dict) and arguments.get("type") == "delete_file":
        arguments = {k: v for k, v in arguments.items() if k != "diff"}  # a deletion has none (the function's is required)
    item = {"id": item_id, "type": found.call, "status": status, "call_id": call_id, found.field: arguments}
    return {**item, "execution": "client"} if found is _SEARCH else item


def arguments_of(raw: str) -> Any:
    """The upstream's arguments as the call item's object (what was written of them, for a call cut by the
    output limit; {} if they hold no object)."""
    try:
        value = jiter.from_json(raw.encode(), partial_mode="trailing-strings")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def history_arguments(found: ClientTool, item: dict[str, Any]) -> str:
    """A history call item's arguments as the function call's JSON."""
    value = item.get(found.field)
    return value if isinstance(value, str) else orjson.dumps(value if value is not None else {}).decode()


def result_text(found: ClientTool, item: dict[str, Any]) -> str:
    """A client tool's output item as its function's result: a search's names the tools it loaded (as the
    upstream knows them: they are offered as tools, tool_search.py), a patch's its status and output, a shell's
    each command's output and exit."""
    if found is _SEARCH:
        return output_text([str(tool.get("name")) for tool in flattened(item.get("tools")) if isinstance(tool, dict) and tool.get("name")])
    if found is _APPLY_PATCH:
        return f"{item.get('status') or 'completed'}" + (f": {item['output']}" if item.get("output") else "")
    parts = []
    for chunk in item.get("output") or ():
        if not isinstance(chunk, dict):
            continue
        outcome = chunk.get("outcome") or {}
        ended = "timed out" if outcome.get("type") == "timeout" else f"exit code {outcome.get('exit_code')}"
        parts.append("\n".join(part for part in (chunk.get("stdout"), chunk.get("stderr") and f"stderr:\n{chunk['stderr']}", ended) if part))
    return "\n\n".join(parts)
