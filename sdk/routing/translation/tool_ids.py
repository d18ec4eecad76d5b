"""Tool call ids, and tool names, as each protocol takes them. A call and its result carry one id, and a
conversation is sent again every turn: each id (and name) is a pure function of the client's, so both stay
paired and the prefix (and so the provider's prompt cache) stays the same turn to turn."""

from __future__ import annotations

import hashlib
import re
from typing import Any

# Claude's tool ids are letters, digits, `_` and `-`; other servers' call ids (Kimi's
# `functions.get_weather:0`, ids with dots or colons) in a Chat history are a 400 there.
_NOT_IN_TOOL_ID = re.compile(r"[^a-zA-Z0-9_-]")


def claude_tool_id(call_id: Any) -> str:
    """A Chat tool call id as a Claude tool id: the same id wherever it appears (call and result)."""
    return _NOT_IN_TOOL_ID.sub("_", str(call_id)) or "_"


# OpenAI takes tool call ids of at most 40 characters ("Invalid 'messages[1].tool_calls[0].id': string too
# long. Expected a string with maximum length 40"); other servers' ids in a history can be longer.
OPENAI_TOOL_ID_MAX = 40


def openai_tool_id(call_id: Any) -> str:
    """A tool id as an OpenAI tool call id: as it is up to 40 characters, else `call_` and 35 hex digits of
    its SHA-256. A pure function: a call and its result get one id, and every turn the same, so the
    conversation's prefix (and the provider's prompt cache) stays stable. Nothing maps it back: an answer's
    tool calls carry the upstream's own new ids."""
    text = str(call_id)
    return text if len(text) <= OPENAI_TOOL_ID_MAX else "call_" + hashlib.sha256(text.encode()).hexdigest()[:35]


# OpenAI takes function names of at most 64 characters ("Invalid 'tools[0].function.name': string too long. Expected
# a string with maximum length 64"); Claude takes 128, and MCP tools of a coding agent (`mcp__server__tool`) use them.
OPENAI_TOOL_NAME_MAX = 64


def openai_tool_name(name: Any) -> str:
    """A Claude tool name as an OpenAI function name: as it is up to 64 characters, else its first 55, `_` and 8 hex
    digits of its SHA-256 (the same every turn, in the tools, the history's calls and tool_choice alike)."""
    text = str(name)
    if len(text) <= OPENAI_TOOL_NAME_MAX:
        return text
    return f"{text[:OPENAI_TOOL_NAME_MAX - 9]}_{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def shortened_tool_names(body: dict[str, Any]) -> dict[str, str]:
    """The Messages request's tool names an OpenAI target knows by another name: that name → the client's."""
    names = [tool.get("name") for tool in body.get("tools") or () if isinstance(tool, dict)]
    return {openai_tool_name(name): name for name in names if isinstance(name, str) and len(name) > OPENAI_TOOL_NAME_MAX}
