"""Anthropic-defined tools that the client runs, for an OpenAI target.

Claude knows such a tool by its type alone (`{"type": "memory_20250818", "name": "memory"}`): Anthropic supplies
its description and input schema (for the memory tool it adds the memory protocol to the system prompt too), and
the client runs the calls. An OpenAI model has function tools only, so each tool of `_TOOLS` goes as a function of
the name the client declared (the client dispatches the tool_use blocks by it), with the input schema Anthropic
publishes and what Claude is told of the tool in its description; its calls come back as those tool_use blocks, and
the history's calls and tool_result blocks go as the function's, as any custom tool's.

- memory_20250818 (the anthropic SDK's BetaAbstractMemoryTool and tool runner, the Vercel AI SDK's
  `anthropic.tools.memory_20250818`): the commands of the SDK's BetaMemoryTool20250818*Command types.
- bash_20250124 (`bash`): `command`, or `restart: true` for a fresh session (Anthropic's bash tool documentation;
  the SDK's ToolBash20250124Param declares the tool, not its input).
- text_editor_20250728 and text_editor_20250429 (`str_replace_based_edit_tool`, Claude 4): view / create /
  str_replace / insert; text_editor_20250124 (`str_replace_editor`, Claude 3.7) has undo_edit as well (Anthropic's
  text editor documentation, the editor of its computer-use demo, anthropics/anthropic-quickstarts, and the Vercel
  AI SDK's input schemas). Insert's text: the documentation names it `new_str`, but Claude 4 sends `insert_text`
  with both of its editors (anthropics/anthropic-sdk-python#1155; vercel/ai#12111 checked 20250429 as well), and
  the clients that run them read that (the Vercel AI SDK's 20250728 schema, inspect_ai's text_editor): the model
  is asked for what Claude sends, `insert_text` for Claude 4's editors and `new_str` for 3.7's (what the demo's
  editor, written for it, reads). 20250728's `max_characters` (how much of a file view shows) goes in the
  description.

Stay refused: server tools (Anthropic runs them), the computer-use tools (computer_*: the client answers with
screenshots of a display, which only a model trained to act on them can use), and versions whose input this
module does not know for certain (bash_20241022, text_editor_20241022, later dates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class _Defined:
    name: str  # Anthropic's name for the tool, where the client declares none
    description: str
    schema: dict[str, Any]
    limits_view: bool = False  # takes `max_characters` (text_editor_20250728): the client cuts a file's view there


_MEMORY_DESCRIPTION = (
    "Your memory: a directory, /memories, whose files last across conversations; every path is under it. Commands: "
    "view (a directory's listing, or a file's numbered lines, view_range [first, last] for some of them), create "
    "(path, file_text), str_replace (path, old_str replaced by new_str), insert (path, insert_text at insert_line), "
    "delete (path), rename (old_path to new_path). Always view your memory directory before doing anything else. As "
    "you make progress, record its status, your decisions and what is left in memory: your context may be reset at "
    "any moment, and what is not in memory is lost.")
_BASH_DESCRIPTION = (
    "Run a command in a persistent bash shell: the working directory, environment variables and files last from one "
    "call to the next. Send command, the command to run (required unless restarting), or restart: true alone to start "
    "a fresh shell. Avoid commands that wait for input or never end; long output may be truncated.")
_EDITOR_DESCRIPTION = (
    "View, create and edit text files; paths are absolute. Commands: view (a file's numbered lines, view_range "
    "[first, last] for some of them, -1 as last for the rest of the file; a directory's listing), create (path, "
    "file_text: a new file), str_replace (path, old_str, which must match exactly one place in the file, whitespace "
    "included, replaced by new_str), insert (path, {insert} put after line insert_line, 0 for the file's start){undo}.")

# Inputs the memory tool and the text editors share, with what each command takes them for.
_EDITS: dict[str, Any] = {
    "view_range": {"type": "array", "items": {"type": "integer"}, "description": "view: the first and last line to show."},
    "file_text": {"type": "string", "description": "create: the file's content."},
    "old_str": {"type": "string", "description": "str_replace: the text to replace."},
    "insert_line": {"type": "integer", "description": "insert: the line number."}}
_MEMORY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {
    "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "delete", "rename"]},
    "path": {"type": "string", "description": "The file or directory (all but rename)."},
    **_EDITS,
    "new_str": {"type": "string", "description": "str_replace: the text to put in its place."},
    "insert_text": {"type": "string", "description": "insert: the text."},
    "old_path": {"type": "string", "description": "rename: the current path."},
    "new_path": {"type": "string", "description": "rename: the new path."}},
    "required": ["command"]}
# No input is required: a restart sends none but `restart`.
_BASH_SCHEMA: dict[str, Any] = {"type": "object", "properties": {
    "command": {"type": "string", "description": "The bash command to run. Required unless the tool is being restarted."},
    "restart": {"type": "boolean", "description": "true restarts the shell; leave it out otherwise."}}}


def _editor(name: str, commands: list[str], insert: str, limits_view: bool = False) -> _Defined:
    """A text editor of these commands (view, create, str_replace, insert, and Claude 3.7's undo_edit) whose insert
    takes its text as `insert` (new_str or insert_text)."""
    texts = {"new_str": {"type": "string", "description": "str_replace: the text to put in its place."}}
    texts[insert] = {"type": "string", "description": "str_replace: the text to put in its place; insert: the text."
                     if insert == "new_str" else "insert: the text."}
    schema = {"type": "object", "properties": {
        "command": {"type": "string", "enum": commands},
        "path": {"type": "string", "description": "The file or directory, an absolute path."},
        **_EDITS, **texts},
        "required": ["command", "path"]}
    undo = ", undo_edit (path: the file's last edit undone)" if "undo_edit" in commands else ""
    return _Defined(name, _EDITOR_DESCRIPTION.format(insert=insert, undo=undo), schema, limits_view)


_CLAUDE_4_EDITS = ["view", "create", "str_replace", "insert"]
_TOOLS: dict[str, _Defined] = {
    "memory_20250818": _Defined("memory", _MEMORY_DESCRIPTION, _MEMORY_SCHEMA),
    "bash_20250124": _Defined("bash", _BASH_DESCRIPTION, _BASH_SCHEMA),
    "text_editor_20250124": _editor("str_replace_editor", [*_CLAUDE_4_EDITS, "undo_edit"], "new_str"),
    "text_editor_20250429": _editor("str_replace_based_edit_tool", _CLAUDE_4_EDITS, "insert_text"),
    "text_editor_20250728": _editor("str_replace_based_edit_tool", _CLAUDE_4_EDITS, "insert_text", limits_view=True),
}
# What the client may set on the tool that a function tool made of it keeps (input_examples go in the description).
_KEPT = ("cache_control", "strict", "input_examples")


def as_custom(tool: dict[str, Any]) -> dict[str, Any] | None:
    """An Anthropic-defined tool the client runs as the custom tool Claude would be told of (its name, Anthropic's
    description and input schema); None for any other tool type."""
    kind = tool.get("type")
    defined = _TOOLS.get(kind) if isinstance(kind, str) else None
    if defined is None:
        return None
    description = defined.description
    limit = tool.get("max_characters")
    if defined.limits_view and isinstance(limit, int) and not isinstance(limit, bool):
        description += f" view shows at most {limit} characters of a file: view_range for the rest."
    kept = {key: tool[key] for key in _KEPT if tool.get(key) is not None}
    return {**kept, "name": tool.get("name") or defined.name, "description": description, "input_schema": defined.schema}
