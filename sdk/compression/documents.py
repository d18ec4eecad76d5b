"""Explicitly marked documents inside one message's content, and writing replacements back.

Explicit documents (found in any place the scope allows):
- an Anthropic `document` block with a plain-text source and no citations (citations point at
  character offsets the provider must see intact);
- the inside of a `<document>` or `<context>` tag in a text (string content, text block or part);
- in a user message with several text blocks/parts, every one but the last (the last is the question).
Plain prose around them is located by sdk/compression/places.py. The body is never mutated: touched
messages and blocks are copied, the rest is shared.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Any

# Opening and closing tags, found in one linear pass (attributes bounded, so a '<document' without
# its '>' cannot make each later start rescan the text); pairing is done in `_tagged`. A lazy
# `<document>(.*?)</document>` over the whole text is quadratic in the number of unclosed tags.
_TAG = re.compile(r"<(/?)(document|context)\b[^>]{0,1024}>", re.IGNORECASE)
SYSTEM = -1  # message index of Anthropic's top-level `system`


@dataclass(frozen=True, slots=True)
class Slot:
    """One text inside a message: string content (block -1), a text block/part, or a document's data."""

    block: int
    key: str  # "text" or "data"
    text: str


@dataclass(frozen=True, slots=True)
class Span:
    slot: Slot
    start: int
    end: int


def text_slots(content: Any) -> list[Slot]:
    """The texts of a message's content, in order: string content, text blocks/parts, plain-text documents."""
    if isinstance(content, str):
        return [Slot(-1, "text", content)]
    if not isinstance(content, list):
        return []
    slots = []
    for b, block in enumerate(content):
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            slots.append(Slot(b, "text", block["text"]))
        elif block.get("type") == "document" and _plain_document(block):
            slots.append(Slot(b, "data", block["source"]["data"]))
    return slots


def explicit(slots: list[Slot], user: bool) -> tuple[list[Span], list[Slot], list[str]]:
    """Explicit documents among a message's slots; the slots without any (prose, or the question);
    and the text around tagged documents (the question or instructions, tags removed).

    Several text blocks in a user message: all but the last are documents (the last is the question)."""
    texts = [s for s in slots if s.key == "text"]
    spans: list[Span] = []
    plain: list[Slot] = []
    around: list[str] = []
    for slot in slots:
        tagged = [Span(slot, start, end) for start, end in _tagged(slot.text)]
        if slot.key == "data":
            spans.append(Span(slot, 0, len(slot.text)))
        elif tagged:
            spans.extend(tagged)
            around.append(_outside(slot.text, tagged))
        elif user and len(texts) > 1 and slot is not texts[-1]:
            spans.append(Span(slot, 0, len(slot.text)))
        else:
            plain.append(slot)
    return spans, plain, around


def _plain_document(block: dict[str, Any]) -> bool:
    source = block.get("source")
    citations = block.get("citations")
    return (
        isinstance(source, dict)
        and source.get("type") == "text"
        and isinstance(source.get("data"), str)
        and not (isinstance(citations, dict) and citations.get("enabled"))
    )


def _tagged(text: str) -> list[tuple[int, int]]:
    """Spans between an opening tag and the first closing tag of the same name after it; an opening
    tag that is never closed is skipped, and the search goes on after each span (as a lazy match would)."""
    tags = list(_TAG.finditer(text))
    closes: dict[str, list[int]] = {}
    for i, tag in enumerate(tags):
        if tag.group(1):
            closes.setdefault(tag.group(2).lower(), []).append(i)
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(tags):
        tag = tags[i]
        candidates = closes.get(tag.group(2).lower(), [])
        j = bisect.bisect_right(candidates, i)
        if tag.group(1) or j == len(candidates):
            i += 1
            continue
        spans.append((tag.end(), tags[candidates[j]].start()))
        i = candidates[j] + 1
    return spans


def _outside(text: str, spans: list[Span]) -> str:
    """The text around tagged documents (the question or instructions), with the tags themselves removed."""
    parts, pos = [], 0
    for span in spans:
        parts.append(text[pos : span.start])
        pos = span.end
    parts.append(text[pos:])
    return _TAG.sub(" ", "".join(parts)).strip()


Edit = tuple[int, int, str]  # (start, end, replacement) inside one slot's text


def apply(body: dict[str, Any], edits: dict[tuple[int, int, str], list[Edit]]) -> dict[str, Any]:
    """A new body with the edits made; keys are (message, block, key), message SYSTEM for the
    top-level system. Untouched messages and blocks are shared, not copied."""
    if not edits:
        return body
    body = dict(body)
    messages = list(body["messages"])
    for (m, b, key), changes in edits.items():
        holder = body if m == SYSTEM else dict(messages[m])
        field = "system" if m == SYSTEM else "content"
        if b < 0:
            holder[field] = _splice(holder[field], changes)
        else:
            content = list(holder[field])
            block = dict(content[b])
            if key == "data":
                block["source"] = {**block["source"], "data": _splice(block["source"]["data"], changes)}
            else:
                block["text"] = _splice(block["text"], changes)
            content[b] = block
            holder[field] = content
        if m != SYSTEM:
            messages[m] = holder
    body["messages"] = messages
    return body


def _splice(text: str, edits: list[Edit]) -> str:
    parts, pos = [], 0
    for start, end, replacement in sorted(edits):
        parts.append(text[pos:start])
        parts.append(replacement)
        pos = end
    parts.append(text[pos:])
    return "".join(parts)
