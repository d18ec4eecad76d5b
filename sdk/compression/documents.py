"""Where documents live in a request, what may be touched, and how replacements are written back.

The rule (docs/compression.md):
- Only user messages are searched; system, tools and assistant turns are never read for documents.
- A document is (a) an Anthropic `document` block with a plain-text source and no citations (citations
  point at character offsets the provider must see intact), (b) the inside of a `<document>` or
  `<context>` tag in a user text, or (c) a text block/part of a user message that has more than one,
  other than its last (the last one is the question). Plain single-text messages are never documents.
- Documents below `min_tokens` are left alone; so is everything at or before the last `cache_control`
  marker in the messages (the provider's cached prefix), and the latest user turn when
  `latest_turn` is off. The question text of any turn is never touched.
- Each document is scored against the question of its own turn (the turn's text outside documents),
  else the next user turn's, so a document's compressed form never changes as the conversation goes on.
The body is never mutated: touched messages and blocks are copied, the rest is shared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_TAGGED = re.compile(r"<(document|context)\b[^>]*>(.*?)</\1\s*>", re.DOTALL | re.IGNORECASE)

Position = tuple[int, int]  # (message index, block index); block -1 for string content


@dataclass(frozen=True, slots=True)
class Found:
    message: int
    block: int  # -1: the message content is a string
    key: str  # "text" (text block/part, or string content) or "data" (document source)
    start: int  # span inside that text
    end: int
    text: str
    query: str


def frozen_until(body: dict[str, Any]) -> Position:
    """The last (message, block) inside the provider's cached prefix; (-1, -1) when none is marked.

    A top-level `cache_control` (automatic caching) caches up to the last block: everything is frozen.
    Markers on tools or system blocks cache only those, which compression never touches anyway."""
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


def latest_user(messages: list[Any]) -> int:
    for m in range(len(messages) - 1, -1, -1):
        if isinstance(messages[m], dict) and messages[m].get("role") == "user":
            return m
    return -1


def find_documents(body: dict[str, Any], min_chars: int, latest_turn: bool) -> list[Found]:
    """Document spans in the order they appear. `min_chars` is a cheap pre-filter; the caller applies
    the token threshold (documents shorter than it in characters cannot reach it in tokens)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    frozen = frozen_until(body)
    latest = latest_user(messages)
    pending: list[tuple[int, int, str, int, int, str]] = []
    questions: dict[int, str] = {}
    for m, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        spans, question = _scan(message.get("content"), min_chars)
        questions[m] = question
        if (m, 1 << 30) <= frozen or (m == latest and not latest_turn):
            continue
        pending.extend((m, b, key, s, e, text) for b, key, s, e, text in spans if (m, b) > frozen)
    user_turns = sorted(questions)
    found = []
    for m, b, key, s, e, text in pending:
        query = questions[m] or next((questions[u] for u in user_turns if u > m and questions[u]), "")
        if query:  # without any question there is nothing to rank against: leave the document alone
            found.append(Found(m, b, key, s, e, text[s:e], query))
    return found


def _scan(content: Any, min_chars: int) -> tuple[list[tuple[int, str, int, int, str]], str]:
    """(block, key, start, end, full text) of each document in one message, and the message's question."""
    if isinstance(content, str):
        spans = [(-1, "text", s, e, content) for s, e in _tagged(content, min_chars)]
        return spans, _outside(content, [(s, e) for _, _, s, e, _ in spans])
    if not isinstance(content, list):
        return [], ""
    texts = [b for b, block in enumerate(content) if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)]
    spans: list[tuple[int, str, int, int, str]] = []
    question: list[str] = []
    for b, block in enumerate(content):
        if not isinstance(block, dict):
            continue
        if block.get("type") == "document" and _plain_document(block) and len(block["source"]["data"]) >= min_chars:
            spans.append((b, "data", 0, len(block["source"]["data"]), block["source"]["data"]))
        elif b in texts:
            text = block["text"]
            tagged = _tagged(text, min_chars)
            if tagged:
                spans.extend((b, "text", s, e, text) for s, e in tagged)
                question.append(_outside(text, tagged))
            elif b != texts[-1] and len(text) >= min_chars:
                spans.append((b, "text", 0, len(text), text))
            else:
                question.append(text)
    return spans, "\n".join(q for q in question if q.strip())


def _plain_document(block: dict[str, Any]) -> bool:
    source = block.get("source")
    citations = block.get("citations")
    return (
        isinstance(source, dict)
        and source.get("type") == "text"
        and isinstance(source.get("data"), str)
        and not (isinstance(citations, dict) and citations.get("enabled"))
    )


def _tagged(text: str, min_chars: int) -> list[tuple[int, int]]:
    return [m.span(2) for m in _TAGGED.finditer(text) if m.end(2) - m.start(2) >= min_chars]


def _outside(text: str, spans: list[tuple[int, int]]) -> str:
    parts, pos = [], 0
    for s, e in spans:
        parts.append(text[pos:s])
        pos = e
    parts.append(text[pos:])
    return re.sub(r"<(/?)(document|context)\b[^>]*>", " ", "".join(parts)).strip()


def apply(body: dict[str, Any], replacements: dict[Found, str]) -> dict[str, Any]:
    """A new body with each found span replaced; untouched messages and blocks are shared, not copied."""
    if not replacements:
        return body
    messages = list(body["messages"])
    by_place: dict[tuple[int, int, str], list[tuple[Found, str]]] = {}
    for found, text in replacements.items():
        by_place.setdefault((found.message, found.block, found.key), []).append((found, text))
    for (m, b, key), edits in by_place.items():
        message = dict(messages[m])
        original = message["content"] if b < 0 else (message["content"][b]["source"]["data"] if key == "data" else message["content"][b]["text"])
        updated = _splice(original, sorted(edits, key=lambda edit: edit[0].start))
        if b < 0:
            message["content"] = updated
        else:
            content = list(message["content"])
            block = dict(content[b])
            if key == "data":
                block["source"] = {**block["source"], "data": updated}
            else:
                block["text"] = updated
            content[b] = block
            message["content"] = content
        messages[m] = message
    return {**body, "messages": messages}


def _splice(text: str, edits: list[tuple[Found, str]]) -> str:
    parts, pos = [], 0
    for found, replacement in edits:
        parts.append(text[pos : found.start])
        parts.append(replacement)
        pos = found.end
    parts.append(text[pos:])
    return "".join(parts)
