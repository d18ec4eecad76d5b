"""Anthropic-defined tools that the client runs, for an OpenAI target.

Claude knows such a tool by its type alone (`{"type": "memory_20250818", "name": "memory"}`): Anthropic supplies
its description and input schema, and for the memory tool adds the memory protocol to the system prompt. The
client runs the calls (the anthropic SDK's BetaAbstractMemoryTool and its tool runner, the Vercel AI SDK's
`anthropic.tools.memory_20250818`). An OpenAI model has function tools only, so the tool goes as a function of
its name, with the schema of the commands the client takes (the SDK's BetaMemoryTool20250818*Command types) and
the protocol in its description; its calls come back as the tool_use blocks the client dispatches by `command`.
Other Anthropic-defined tools (server tools, and client tools whose schema Anthropic does not publish in full)
stay refused.
"""

from __future__ import annotations

from typing import Any

MEMORY = "memory_20250818"
_MEMORY_DESCRIPTION = (
    "Your memory: a directory, /memories, whose files last across conversations; every path is under it. Commands: "
    "view (a directory's listing, or a file's numbered lines, view_range [first, last] for some of them), create "
    "(path, file_text), str_replace (path, old_str replaced by new_str), insert (path, insert_text at insert_line), "
    "delete (path), rename (old_path to new_path). Always view your memory directory before doing anything else. As "
    "you make progress, record its status, your decisions and what is left in memory: your context may be reset at "
    "any moment, and what is not in memory is lost.")
_MEMORY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {
    "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "delete", "rename"]},
    "path": {"type": "string", "description": "The file or directory (all but rename)."},
    "view_range": {"type": "array", "items": {"type": "integer"}, "description": "view: the first and last line to show."},
    "file_text": {"type": "string", "description": "create: the file's content."},
    "old_str": {"type": "string", "description": "str_replace: the text to replace."},
    "new_str": {"type": "string", "description": "str_replace: the text to put in its place."},
    "insert_line": {"type": "integer", "description": "insert: the line the text goes at."},
    "insert_text": {"type": "string", "description": "insert: the text."},
    "old_path": {"type": "string", "description": "rename: the current path."},
    "new_path": {"type": "string", "description": "rename: the new path."}},
    "required": ["command"]}
# What the client may set on the tool that a function tool made of it keeps (input_examples go in the description).
_KEPT = ("cache_control", "strict", "input_examples")


def as_custom(tool: dict[str, Any]) -> dict[str, Any] | None:
    """An Anthropic-defined tool the client runs as the custom tool Claude would be told of (its name, Anthropic's
    description and input schema); None for any other tool type."""
    if tool.get("type") != MEMORY:
        return None
    kept = {key: tool[key] for key in _KEPT if tool.get(key) is not None}
    return {**kept, "name": tool.get("name") or "memory", "description": _MEMORY_DESCRIPTION, "input_schema": _MEMORY_SCHEMA}
