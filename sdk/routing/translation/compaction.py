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
(`content` null) is a no-op to Claude and is left out; its `tool_changes` (what takes the request's `tools` to the tools in
effect after it) are applied there (tool_changes.py).

A Messages request can also ask for a compaction outright (the `compaction: {type: "summarize"}` parameter, anthropic 2.x
beta): the whole conversation is summarized and the answer holds only the `compaction` block, `stop_reason`
`"compaction"`, which the client sends first in `messages` from then on. To an OpenAI model it goes as Codex's trigger
does (`SUMMARIZE`): the conversation, then a user message asking for the summary (the request's `instructions`, which
replace Anthropic's summarization prompt, else INSTRUCTION), `tool_choice: none` where it has tools; the answer's text
comes back as the one block (`summary_message`; streamed as Claude streams it, one `compaction_delta` holding the
summary: `summary_events`), and the block, sent back, is read as above. The block has no `signature`: only Claude signs.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import AsyncIterator
from typing import Any

import orjson

from sdk.routing.translation.streams import anthropic_event
from sdk.sse import event_data, events_of
from sdk.streams import close_after

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
            rest = blocks[j + 1:]
            head = [{"role": "user", "content": SUMMARY_INTRO + block["content"]}, *([{**message, "content": rest}] if rest else [])]
            if block.get("tool_changes"):  # the summarized turns' tool changes, where the summary is (tool_changes.py)
                head.insert(0, {"role": "system", "content": list(block["tool_changes"])})
            return {**body, "messages": head + messages[i + 1:]}
    return body


# --- a Messages compaction request (`compaction: {type: "summarize"}`) to an OpenAI model ------------------------

SUMMARIZE = "compaction"  # the Messages parameter that asks for one
_STOP = "compaction"  # the stop_reason of its answer


def summarize(body: dict[str, Any], out: dict[str, Any]) -> None:
    """The Chat body `out` of the Messages compaction request `body` asking for the summary: the request's
    `instructions` (blank: absent, as Anthropic reads them), else INSTRUCTION, as the last user message; no tool call."""
    config = body[SUMMARIZE]
    given = config.get("instructions") if isinstance(config, dict) else None
    out["messages"].append({"role": "user", "content": given if isinstance(given, str) and given.strip() else INSTRUCTION})
    if out.get("tools"):  # the tools stay in the cached prefix; a summary calls none
        out["tool_choice"] = "none"
        out.pop("parallel_tool_calls", None)


def summary_message(body: bytes) -> bytes:
    """A translated Messages answer to a compaction request as Claude's: its text the one `compaction` block, ended
    `compaction` (a summary cut by the output limit keeps `max_tokens`)."""
    data = orjson.loads(body)
    text = "".join(b.get("text") or "" for b in data.get("content") or () if isinstance(b, dict) and b.get("type") == "text")
    data["content"] = [{"type": "compaction", "content": text or None}]
    if data.get("stop_reason") != "max_tokens":
        data["stop_reason"], data["stop_sequence"] = _STOP, None
    return orjson.dumps(data)


async def summary_events(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A translated Messages stream answering a compaction request, as Claude streams one: its text held, then the one
    `compaction` block (start, one `compaction_delta` with the whole summary, stop) before the message's end."""
    text: list[str] = []
    try:
        async for item in events:
            out: list[bytes] = []
            for event in events_of(item):
                data = event_data(event)
                payload = orjson.loads(data) if data.startswith(b"{") else {}
                kind = payload.get("type")
                if kind in ("content_block_start", "content_block_stop"):
                    continue
                if kind == "content_block_delta":
                    text.append((payload.get("delta") or {}).get("text") or "")
                    continue
                if kind == "message_delta":
                    summary = "".join(text) or None
                    out += [anthropic_event({"type": "content_block_start", "index": 0, "content_block": {"type": "compaction", "content": None}}),
                            anthropic_event({"type": "content_block_delta", "index": 0, "delta": {"type": "compaction_delta", "content": summary}}),
                            anthropic_event({"type": "content_block_stop", "index": 0})]
                    delta = payload.get("delta") or {}
                    if delta.get("stop_reason") != "max_tokens":
                        payload["delta"] = {**delta, "stop_reason": _STOP, "stop_sequence": None}
                    event = anthropic_event(payload)
                out.append(event)
            if out:
                yield b"".join(out)
    finally:
        await close_after(events)
