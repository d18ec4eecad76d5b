"""Anthropic's context editing (`context_management.edits`) on a request for an OpenAI target.

Claude applies each edit server-side, before the prompt reaches the model, and only once the request
reaches the edit's trigger (Anthropic's context-editing guide; the anthropic SDK's beta params):

- `clear_tool_uses_20250919`: past `trigger` (input tokens, 100,000 by default, or a number of tool uses)
  the oldest tool results (and, with `clear_tool_inputs`, their calls' inputs) are replaced by a
  placeholder, keeping the `keep` most recent tool uses (3 by default) and those of `exclude_tools`;
- `clear_thinking_20251015`: earlier turns' thinking blocks are left out (a Chat target never gets them:
  the translation leaves every earlier turn's thinking out);
- `compact_20260112`: past `trigger` (150,000 input tokens by default) the conversation is summarized
  into a `compaction` block.

An edit that would not act on this request changes nothing Claude would have been sent, so it is left
out and the request goes on, `context_management` named dropped. Whether it would act is decided on the
side of acting: the input is counted as sdk/estimate.py counts a Messages request for a budget (cl100k
× 1.2, leaning above Claude's own count), and `clear_at_least`, which only holds an edit back, is not
read. An edit that would act is refused, naming it: an OpenAI target would be sent the whole
conversation where Claude is sent a shorter one, and the client would be told nothing was cleared.

The answer says what was applied, as Anthropic's does: `context_management: {"applied_edits": []}`
(the body; a stream's `message_start` and `message_delta`), so a client reading `applied_edits` reads
that nothing was cleared.
"""

from __future__ import annotations

from typing import Any

from sdk.estimate import input_tokens
from sdk.types import Endpoint, LLMRequest

CLEAR_TOOL_USES = "clear_tool_uses_20250919"
COMPACT = "compact_20260112"
# Anthropic's defaults: clearing past 100,000 input tokens keeping 3 tool uses; compaction past 150,000.
_TRIGGER = {CLEAR_TOOL_USES: 100_000, COMPACT: 150_000}
_KEEP = 3


def acting(value: Any, body: dict[str, Any]) -> str | None:
    """None when no edit of `value` (a Messages request's `context_management`) would act on `body`; otherwise
    what the refusal names: the first edit that would (or that this module does not know)."""
    edits = value.get("edits") if isinstance(value, dict) and set(value) <= {"edits"} else None
    if not isinstance(edits, list) or not all(isinstance(edit, dict) for edit in edits):
        return "a 'context_management' other than a list of edits"
    tokens: list[int] = []  # the input, counted once, when an edit's trigger is in input tokens
    for i, edit in enumerate(edits):
        kind = str(edit.get("type", ""))
        if kind.startswith("clear_thinking_"):
            continue
        if kind not in _TRIGGER:
            return f"context_management.edits.{i}: the edit {kind!r}"
        why = _acts(kind, edit, body, tokens)
        if why:
            return (f"context_management.edits.{i}: {kind} ({why}, where Claude would edit the conversation an OpenAI "
                    "model would be sent whole)")
    return None


def _acts(kind: str, edit: dict[str, Any], body: dict[str, Any], tokens: list[int]) -> str | None:
    """Why `edit` would act on `body` (its trigger reached, something to clear), or None when it would not."""
    uses = _tool_uses(body)
    if kind == CLEAR_TOOL_USES:
        keep = edit.get("keep") or {}
        kept = keep.get("value", _KEEP) if isinstance(keep, dict) else _KEEP
        excluded = set(edit.get("exclude_tools") or ())
        if len(uses) <= kept or all(name in excluded for name in uses):
            return None  # nothing it may clear: every tool use is among the kept or excluded
    trigger = edit.get("trigger") or {"type": "input_tokens", "value": _TRIGGER[kind]}
    limit = trigger.get("value") if isinstance(trigger, dict) else None
    if not isinstance(limit, int):
        return f"a trigger of {trigger!r}"
    if trigger.get("type") == "tool_uses":
        return f"{len(uses)} tool uses reach its trigger of {limit}" if len(uses) >= limit else None
    if trigger.get("type") != "input_tokens":
        return f"a trigger of {trigger.get('type')!r}"
    if not tokens:
        tokens.append(input_tokens(LLMRequest(Endpoint.MESSAGES, body)))
    return f"an input of about {tokens[0]} tokens reaches its trigger of {limit}" if tokens[0] >= limit else None


def _tool_uses(body: dict[str, Any]) -> list[str]:
    """The names of the conversation's tool calls (tool_use blocks), oldest first."""
    contents = [message.get("content") for message in body.get("messages") or () if isinstance(message, dict)]
    return [str(block.get("name")) for content in contents if isinstance(content, list)
            for block in content if isinstance(block, dict) and block.get("type") == "tool_use"]


def answered(request: dict[str, Any]) -> dict[str, Any]:
    """What a translated Messages answer says of the request's context editing: that nothing was applied
    (an edit that would have acted was refused); nothing when the request asked for none."""
    return {"context_management": {"applied_edits": []}} if request.get("context_management") is not None else {}
