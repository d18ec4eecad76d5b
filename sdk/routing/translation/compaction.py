"""Responses compaction across a translation.

Codex compacts a long conversation by sending it again with `{"type": "compaction_trigger"}` as the last
input item, and expects exactly one `compaction` item back, whose `encrypted_content` it sends in place of
the conversation from then on. OpenAI's content is encrypted for OpenAI's models; a Chat or Claude target
writes a summary instead:

- the trigger goes as a last user message asking for a summary a model can carry the work on from, with
  `tool_choice: none` (the tools stay, so the conversation's cached prefix is read, not written again);
- the answer's text comes back as the one `compaction` item, its `encrypted_content` the summary under a
  mark of the gateway's (streamed as that item's added and done events, not as text);
- a later request's `compaction` item with that mark goes as a user message holding the summary. One made
  by OpenAI (encrypted: no other model can read it) is refused, naming it, rather than dropped with the
  conversation it stands for;
- so does one sent to a native OpenAI target (the route's fallback, or a route changed mid-session), which
  would refuse the gateway's content as `invalid_encrypted_content` (`readable_by_openai`).

Claude compacts the same way (context_management's `compact_20260112`): its answer holds a `compaction` block whose
`content` is the summary in the clear, the client sends the block back in its history, and Claude drops every block
before it, reading the conversation on from the summary. A Messages conversation holding one reaches an OpenAI model
the same way (`claude_compacted`): the summary as a user message (SUMMARY_INTRO, as the Responses door gives one), then
what followed the block; what came before it is not sent, as Claude does not read it. A compaction that failed
(`content` null) is a no-op to Claude and is left out; one with `tool_changes` (the tools in effect after it, which the
request's `tools` do not show) is refused, naming it.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from sdk.routing.translation.fields import refuse

TRIGGER = "compaction_trigger"
_MARK = "slipstream-summary.v1."  # what no OpenAI-encrypted content starts with
INSTRUCTION = (
    "Your context is about to be compacted: the conversation above will be replaced by what you write now. Write a "
    "summary another model can carry the work on from, without the conversation: the task and the user's "
    "requirements and preferences, what has been done and decided (files, commands, results, errors), what is "
    "left to do next, and any data or references it will need. Be concise and structured; call no tools.")
SUMMARY_INTRO = "The conversation so far was compacted into this summary:\n\n"


def compacting(body: dict[str, Any]) -> bool:
    """Whether `body` asks for a compaction: its last input item is the trigger."""
    items = body.get("input")
    return isinstance(items, list) and bool(items) and isinstance(items[-1], dict) and items[-1].get("type") == TRIGGER


def item(item_id: str, summary: str) -> dict[str, Any]:
    """The one output item of a compaction: the summary, marked as the gateway's."""
    content = _MARK + base64.b64encode(summary.encode()).decode()
    return {"id": item_id, "type": "compaction", "encrypted_content": content}


def summary_of(entry: dict[str, Any]) -> str | None:
    """The summary a `compaction` input item holds, if the gateway made it (None: OpenAI's encrypted content)."""
    content = entry.get("encrypted_content")
    if not isinstance(content, str) or not content.startswith(_MARK):
        return None
    try:
        return base64.b64decode(content[len(_MARK):], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def as_message(entry: Any) -> dict[str, Any] | None:
    """A `compaction` input item the gateway made, as the user message holding its summary (None: another item)."""
    summary = summary_of(entry) if isinstance(entry, dict) and entry.get("type") == "compaction" else None
    return {"role": "user", "content": SUMMARY_INTRO + summary} if summary is not None else None


def readable_by_openai(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with the gateway's compaction items as their summaries (OpenAI reads only its own); as it came without."""
    items = body.get("input")
    if not isinstance(items, list) or all(as_message(entry) is None for entry in items):
        return body
    return {**body, "input": [as_message(entry) or entry for entry in items]}


def claude_compacted(body: dict[str, Any]) -> dict[str, Any]:
    """A Messages body as Claude reads it after its last `compaction` block that holds a summary: the summary a user
    message, then what followed the block (the messages before it left out); `body` itself where there is none."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return body
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        content = message.get("content") if isinstance(message, dict) else None
        blocks: list[Any] = content if isinstance(content, list) else []
        for j in range(len(blocks) - 1, -1, -1):
            block = blocks[j]
            if not (isinstance(block, dict) and block.get("type") == "compaction" and isinstance(block.get("content"), str)
                    and block["content"]):
                continue
            if block.get("tool_changes"):
                raise refuse(f"messages.{i}.content.{j}.tool_changes (the tools in effect after a compaction)", "OpenAI")
            rest = blocks[j + 1:]
            head = [{"role": "user", "content": SUMMARY_INTRO + block["content"]}, *([{**message, "content": rest}] if rest else [])]
            return {**body, "messages": head + messages[i + 1:]}
    return body
