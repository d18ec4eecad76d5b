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
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

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
