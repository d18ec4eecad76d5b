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

The gateway applies `clear_tool_uses_20250919` as Claude does (`edited`), before the conversation is
translated: past its trigger, every tool use older than the `keep` most recent ones (of any tool) and not
of an `exclude_tools` tool has its tool_result's content replaced by `PLACEHOLDER` (the block's other keys
kept: its id, `is_error`, `cache_control`), and with `clear_tool_inputs` (true, or a list naming the tool)
its tool_use's input becomes `{}`. Only client tool uses (tool_use / tool_result blocks) are counted and
cleared. The input is counted as sdk/estimate.py counts a Messages request for a budget (cl100k × 1.2,
leaning above Claude's own count), the trigger reached at its value (`>=`); what a use's clearing saves
is its result's (and cleared input's) tokens less the placeholder's, counted the same way, and that sum
is `cleared_input_tokens`. `clear_at_least` holds the edit back: where clearing every eligible use would
save fewer tokens than it asks, nothing is cleared. Several edits apply in order, each to what the one
before left, its trigger counted on that.

Anthropic does not publish its placeholder's wording; ours is short and says what happened. Claude Code
and the Agent SDK keep the full history client-side, as Anthropic's guide asks, so the client's next
request carries the results again and is cleared again.

An edit that would not act changes nothing Claude would have been sent: `context_management` is named
dropped and the request goes on. `compact_20260112` that would act is refused, naming it (its summary is
written by a model, which the gateway does not do behind the client's back), as is an edit this module
does not know; whether compaction would act is decided on the side of acting (its trigger counted on
the conversation before any clearing, as sdk/estimate.py counts, which leans above Claude's count). The refusal says
what works instead on this target (COMPACT_INSTEAD): the summary asked for outright (`compaction: {type: "summarize"}`,
compaction.py), the conversation then sent on from its compaction block, whose trigger is counted on that.

The answer says what was applied, as Anthropic's does: `context_management: {"applied_edits": [...]}`
(the body; a stream's `message_start` and `message_delta`), each applied clearing as
`{"type": "clear_tool_uses_20250919", "cleared_tool_uses": N, "cleared_input_tokens": M}`, and `[]`
where nothing was cleared. A token count (`/v1/messages/count_tokens`) counts the cleared conversation and
says the whole one's count as `context_management.original_input_tokens` (provider.py), as Anthropic's does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from sdk.estimate import EXACT_CHARS, count_texts, input_tokens
from sdk.types import Endpoint, LLMRequest, Protocol

CLEAR_TOOL_USES = "clear_tool_uses_20250919"
COMPACT = "compact_20260112"
# Anthropic's defaults: clearing past 100,000 input tokens keeping 3 tool uses; compaction past 150,000.
_TRIGGER = {CLEAR_TOOL_USES: 100_000, COMPACT: 150_000}
_KEEP = 3
# What a cleared tool result says instead (Anthropic's own wording is not published).
PLACEHOLDER = "[Tool result cleared from context]"
_CLEAR_KEYS = {"type", "trigger", "keep", "clear_at_least", "exclude_tools", "clear_tool_inputs"}


@dataclass(slots=True)
class Edited:
    """A Messages body as Claude would be sent it after its context edits, and what was applied."""

    body: dict[str, Any]
    applied: list[dict[str, Any]] = field(default_factory=list)


def refused(value: Any, body: dict[str, Any]) -> str | None:
    """None when every edit of `value` (a Messages request's `context_management`) can be applied or would not
    act on `body`; otherwise what the refusal names: the first edit the gateway cannot apply."""
    edits = value.get("edits") if isinstance(value, dict) and set(value) <= {"edits"} else None
    if not isinstance(edits, list) or not all(isinstance(edit, dict) for edit in edits):
        return "a 'context_management' other than a list of edits"
    for i, edit in enumerate(edits):
        kind = str(edit.get("type", ""))
        if kind.startswith("clear_thinking_"):
            continue
        if kind not in _TRIGGER:
            return f"context_management.edits.{i}: the edit {kind!r}"
        why = _malformed(edit) if kind == CLEAR_TOOL_USES else _compacts(edit, body)
        if why:
            return f"context_management.edits.{i}: {kind} ({why})"
    return None


def _malformed(edit: dict[str, Any]) -> str | None:
    """What in a clear_tool_uses edit the gateway cannot read as Anthropic's beta params define it, or None."""
    unknown = sorted(set(edit) - _CLEAR_KEYS)
    if unknown:
        return f"the setting {unknown[0]!r}"
    for key, kinds in (("trigger", ("input_tokens", "tool_uses")), ("keep", ("tool_uses",)), ("clear_at_least", ("input_tokens",))):
        setting = edit.get(key)
        if setting is not None and not (isinstance(setting, dict) and setting.get("type") in kinds and _count(setting.get("value"))):
            return f"a {key} of {setting!r}"
    excluded, inputs = edit.get("exclude_tools"), edit.get("clear_tool_inputs")
    if excluded is not None and not _names(excluded):
        return f"an exclude_tools of {excluded!r}"
    if inputs is not None and not isinstance(inputs, bool) and not _names(inputs):
        return f"a clear_tool_inputs of {inputs!r}"
    return None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(name, str) for name in value)


def _compacts(edit: dict[str, Any], body: dict[str, Any]) -> str | None:
    """Why a compaction edit would act on `body` (its trigger reached), or None when it would not."""
    trigger = edit.get("trigger") or {"type": "input_tokens", "value": _TRIGGER[COMPACT]}
    limit = trigger.get("value") if isinstance(trigger, dict) else None
    if not isinstance(limit, int) or trigger.get("type") != "input_tokens":
        return f"a trigger of {trigger!r}"
    tokens = input_tokens(LLMRequest(Endpoint.MESSAGES, body))
    if tokens < limit:
        return None
    return (f"an input of about {tokens} tokens reaches its trigger of {limit}, where Claude would replace the conversation "
            f"with a summary it writes and answer from that, which the gateway does not do behind the client's back; "
            f"{COMPACT_INSTEAD}")


# What a client whose compaction would act can do on an OpenAI target instead (compaction.py answers it there).
COMPACT_INSTEAD = ("to compact here, ask for the summary outright (the Messages `compaction: {\"type\": \"summarize\"}` "
                   "parameter: the anthropic SDK tool runner's compact_before_next_turn()) and send the conversation on from its "
                   "compaction block, or raise the edit's trigger")


def edited(body: dict[str, Any]) -> Edited:
    """`body` with its clear_tool_uses edits applied as Claude applies them, and the applied edits (a body whose
    `context_management` `refused` passed). Worked out anew on each call: `Memo` keeps one request's."""
    value = body.get("context_management")
    out = Edited(body)
    for edit in value.get("edits") or () if isinstance(value, dict) else ():
        if isinstance(edit, dict) and edit.get("type") == CLEAR_TOOL_USES and not _malformed(edit):
            out.body, applied = _cleared(edit, out.body)
            out.applied += [applied] if applied else []
    return out


# How a translation step has a request's edits: `edited` itself, or a request's `Memo.edited`.
Edits = Callable[[dict[str, Any]], Edited]


class Memo:
    """One request's edits, worked out once: its translation asks for them several times (the field check, the
    conversation, the answer, a count's two counts). One is made for each attempt (TranslatingProvider), so nothing
    of a request outlives it or is seen by another; the body is held so that its id is not reused."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple[dict[str, Any], Edited] | None = None

    def edited(self, body: dict[str, Any]) -> Edited:
        if self._last is None or self._last[0] is not body:
            self._last = (body, edited(body))
        return self._last[1]


def _cleared(edit: dict[str, Any], body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """`body` with `edit` (clear_tool_uses) applied, and what the answer says of it; `body` itself and None
    where the edit would not act."""
    uses = _tool_uses(body)
    trigger = edit.get("trigger") or {"type": "input_tokens", "value": _TRIGGER[CLEAR_TOOL_USES]}
    keep = (edit.get("keep") or {}).get("value", _KEEP)
    excluded = set(edit.get("exclude_tools") or ())
    eligible = [use for use in uses[:max(0, len(uses) - keep)] if use[2].get("name") not in excluded]
    if not eligible:
        return body, None  # nothing it may clear: every tool use is among the kept or excluded
    reached = len(uses) if trigger["type"] == "tool_uses" else input_tokens(LLMRequest(Endpoint.MESSAGES, body))
    if reached < trigger["value"]:
        return body, None
    inputs = edit.get("clear_tool_inputs")
    results = _results(body)
    counter = _Counter()
    placeholder = count_texts([PLACEHOLDER], Protocol.ANTHROPIC)
    cleared: list[tuple[tuple[int, int], tuple[int, int] | None, bool]] = []
    saved = 0
    for where, id_, use in eligible:
        result = results.get(id_)
        clear_input = (inputs is True or (isinstance(inputs, list) and use.get("name") in inputs)) and bool(use.get("input"))
        if result is None and not clear_input:
            continue  # no result in this conversation, and its input kept: nothing of it to clear
        tokens = max(0, counter.tokens(result[1].get("content")) - placeholder) if result else 0
        saved += tokens + (counter.tokens(use.get("input")) if clear_input else 0)
        cleared.append((where, result[0] if result else None, clear_input))
    at_least = (edit.get("clear_at_least") or {}).get("value", 0)
    if not cleared or saved < at_least:
        return body, None
    return _rewritten(body, cleared), {"type": CLEAR_TOOL_USES, "cleared_tool_uses": len(cleared), "cleared_input_tokens": saved}


class _Counter:
    """Tokens of a few values of one request, counted as sdk/estimate.py counts a Messages request: exactly up to
    EXACT_CHARS characters among them all (its bound on the work done on the event loop), by length beyond."""

    def __init__(self) -> None:
        self.left = EXACT_CHARS

    def tokens(self, value: Any) -> int:
        n = input_tokens(LLMRequest(Endpoint.MESSAGES, {"content": value}), exact=self.left)
        self.left = max(0, self.left - len(orjson.dumps(value)))  # its JSON: at least the text in it
        return n


def _blocks(body: dict[str, Any]) -> list[tuple[tuple[int, int], dict[str, Any]]]:
    """Every content block of the conversation, oldest first, with where it is (message, block)."""
    return [((i, j), block) for i, message in enumerate(body.get("messages") or ()) if isinstance(message, dict)
            and isinstance(message.get("content"), list) for j, block in enumerate(message["content"]) if isinstance(block, dict)]


def _tool_uses(body: dict[str, Any]) -> list[tuple[tuple[int, int], Any, dict[str, Any]]]:
    """The conversation's tool calls (tool_use blocks), oldest first: where each is, its id, the block."""
    return [(where, block.get("id"), block) for where, block in _blocks(body) if block.get("type") == "tool_use"]


def _results(body: dict[str, Any]) -> dict[Any, tuple[tuple[int, int], dict[str, Any]]]:
    """The conversation's tool results by the id of the call they answer: where each is, the block."""
    return {block.get("tool_use_id"): (where, block) for where, block in _blocks(body) if block.get("type") == "tool_result"}


def _rewritten(body: dict[str, Any], cleared: list[tuple[tuple[int, int], tuple[int, int] | None, bool]]) -> dict[str, Any]:
    """`body` with the results at the given places replaced by the placeholder and, where asked, their calls'
    inputs by `{}`; the messages and blocks touched are copies (the client's body is left as it is)."""
    messages = list(body["messages"])
    changes: dict[tuple[int, int], dict[str, Any]] = {}
    for use, result, clear_input in cleared:
        if result is not None:
            changes[result] = {"content": PLACEHOLDER}
        if clear_input:
            changes[use] = {"input": {}}
    for (i, j), change in changes.items():
        content = list(messages[i]["content"])
        content[j] = {**content[j], **change}
        messages[i] = {**messages[i], "content": content}
    return {**body, "messages": messages}


def answered(request: dict[str, Any], edits: Edits = edited) -> dict[str, Any]:
    """What a translated Messages answer says of the request's context editing: the clearings applied (none:
    `[]`); nothing when the request asked for none."""
    if request.get("context_management") is None:
        return {}
    return {"context_management": {"applied_edits": edits(request).applied}}
