"""Where the material is in a request, per the policy's `scope`, and what each piece is scored against.

Places (docs/compression.md):
- `system`: the system prompt (Anthropic's top-level `system`, OpenAI `system`/`developer` messages):
  tagged or explicit documents, or the prose after its instructions (sdk/compression/framing.py).
- `earlier_turns`: user messages before the latest one: explicit documents, or the long prose of a
  plain text (its own question, if it has one, stays byte-identical).
- `latest_turn`: the latest user message: explicit documents, or the part of a plain text before
  its question; when the question cannot be told apart the message is left whole (reason counted).
Assistant turns, tool calls and results, tool schemas and everything at or before the provider's
cached prefix (the last `cache_control` marker) are never touched.

Each piece is scored against the question of its own message, else the question of the next user
turn that has one (the first user turn for the system prompt). That question does not change as the
conversation grows, so an earlier turn compresses to the same bytes on every request and the
provider's prefix cache keeps reading it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sdk.compression import framing
from sdk.compression.documents import SYSTEM, Slot, Span, explicit, text_slots


@dataclass(frozen=True, slots=True)
class Found:
    place: str
    message: int  # index in `messages`, or SYSTEM for Anthropic's top-level system
    block: int  # -1: string content
    key: str  # "text" or "data"
    start: int  # the material is the slot's text[start:end]
    end: int
    text: str
    query: str  # the question the material is ranked against
    instructions: str  # the text around the material (query-aware protection reads it with the question)


@dataclass(slots=True)
class Located:
    found: list[Found] = field(default_factory=list)
    left: list[tuple[str, str, int]] = field(default_factory=list)  # (place, reason, message) of material left whole


@dataclass(slots=True)
class _Entry:
    message: int
    place: str
    material: list[tuple[Span, str]]  # (span, instructions around it)
    question: str


def frozen_until(body: dict[str, Any]) -> tuple[int, int]:
    """The last (message, block) inside the provider's cached prefix; (-1, -1) when none is marked.

    A top-level `cache_control` (automatic caching) caches up to the last block: everything is frozen."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return (-1, -1)
    if body.get("cache_control") is not None:
        return (len(messages), 0)
    last = (-1, -1)
    for m, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            for b, block in enumerate(content):
                if isinstance(block, dict) and block.get("cache_control") is not None:
                    last = (m, b)
    return last


def _system_frozen(body: dict[str, Any]) -> bool:
    system = body.get("system")
    marked = isinstance(system, list) and any(isinstance(b, dict) and b.get("cache_control") is not None for b in system)
    return marked or body.get("cache_control") is not None


def latest_user(messages: list[Any]) -> int:
    for m in range(len(messages) - 1, -1, -1):
        if isinstance(messages[m], dict) and messages[m].get("role") == "user":
            return m
    return -1


def locate(body: dict[str, Any], scope: frozenset[str], min_chars: int) -> Located:
    """The material in `scope`, in request order. `min_chars` is a cheap pre-filter; the caller applies
    the token threshold (material shorter than it in characters cannot reach it in tokens)."""
    messages = body.get("messages")
    located = Located()
    if not isinstance(messages, list):
        return located
    latest = latest_user(messages)
    entries = [_entry(SYSTEM, "system", text_slots(body.get("system")), min_chars, located, scope)] if "system" in scope else []
    for m, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        place = ("latest_turn" if m == latest else "earlier_turns") if role == "user" else "system" if role in ("system", "developer") else ""
        if place:
            entries.append(_entry(m, place, text_slots(message.get("content")), min_chars, located, scope, latest=m == latest))
    questions = [(e.message, e.question) for e in entries if e.place != "system" and e.question]
    frozen = frozen_until(body)
    system_frozen = _system_frozen(body)
    for entry in entries:
        if entry.place not in scope:
            continue
        query = entry.question or next((q for m, q in questions if m > entry.message), "")
        for span, instructions in entry.material:
            if span.end - span.start < min_chars:
                continue
            if (system_frozen if entry.message == SYSTEM else (entry.message, span.slot.block) <= frozen):
                located.left.append((entry.place, "cached_prefix", entry.message))
            elif not query:
                located.left.append((entry.place, "no_question", entry.message))
            else:
                text = span.slot.text[span.start : span.end]
                located.found.append(Found(entry.place, entry.message, span.slot.block, span.slot.key, span.start, span.end, text, query, instructions))
    return located


def _entry(message: int, place: str, slots: list[Slot], min_chars: int, located: Located, scope: frozenset[str], latest: bool = False) -> _Entry:
    """One message's material (explicit documents, framed prose) and its own question."""
    user = place != "system"
    spans, plain, around = explicit(slots, user)
    instructions = "\n".join(a for a in around if a)
    material = [(span, instructions) for span in spans]
    question = [instructions] if user and instructions else []
    for slot in plain:
        if len(slot.text) < min_chars:
            if user:
                question.append(slot.text)  # a short text of a user message is its question
            continue
        frame = framing.user_frame(slot.text, latest) if user else framing.system_frame(slot.text)
        if isinstance(frame, str):
            if place in scope:
                located.left.append((place, frame, message))
            continue
        material.append((Span(slot, frame.start, frame.end), f"{slot.text[: frame.start]}\n{slot.text[frame.end :]}".strip()))
        if frame.question:
            question.append(frame.question)
    return _Entry(message, place, material, "\n".join(q for q in question if q.strip()))
