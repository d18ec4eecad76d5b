"""Where the context is inside a plain text: the instructions before it, the question after it.

Applications paste reference material into prose: the system prompt ("Answer from the context
below.\\n\\nContext:\\n..."), a user message ("Reference documents:\\n\\n...\\n\\nQuestion: ..."). Only
the material may be pruned; the instructions and the question must reach the model byte-identical.
Everything here is found by structure, never guessed from content, and when the structure is not
clear the answer is a reason, not a split (the caller leaves the text whole and counts the reason).

- The **question** of a user text is, in order of confidence: the last line starting with a marker
  (`Question:`, `Q:`, `Query:`, `## Question`); else the last paragraph when it ends with `?` or
  reads as a request (starts with what/how/why/explain/summarize/...); else the last sentence of
  the text when it ends with `?`.
- The **lead-in** is a short paragraph that announces the material: it ends with `:` or it says
  "following"/"below"/"provided" — either way naming it (context, documents, sources, excerpts, ...) —
  or a Markdown heading naming it. Everything up to and including the first lead-in is kept.
- **Separator lines** (`-----`, `=====`) that fence the material bound it on both sides (LlamaIndex's
  templates do this): the material is what lies between the first and the last.
- In a system prompt, a short last paragraph after the material (\"Answer only from the context
  above.\") is kept as an instruction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_MARKER = re.compile(
    r"^[ \t]*(?:#{1,6}[ \t]*|\*\*)?(?:user[ \t]+)?(?:question|query|q)[ \t]*(?:\*\*)?[ \t]*:",
    re.IGNORECASE | re.MULTILINE,
)
_REQUEST = re.compile(
    r"^(?:what|how|why|when|where|which|who|whom|whose|"
    r"explain|summari[sz]e|describe|list|compare|answer|please|based on|according to|given|"
    r"tell me|give me|can you|could you)\b",
    re.IGNORECASE,
)
_MATERIAL = (
    r"(?:context|contexts|documents?|docs|documentation|references?|sources?|excerpts?|passages?|snippets?|"
    r"materials?|knowledge|information|search results|results|articles?|notes|pages?|texts?|data)"
)
_ANNOUNCES = re.compile(rf"\b(?:following|below|provided|attached|given|retrieved)\b.*\b{_MATERIAL}\b|\b{_MATERIAL}\b.*\b(?:following|below|provided|attached)\b", re.IGNORECASE | re.DOTALL)
_NAMES_MATERIAL = re.compile(rf"\b{_MATERIAL}\b", re.IGNORECASE)
_HEADING = re.compile(r"^#{1,6}[ \t]+\S")
_SEPARATOR = re.compile(r"^[ \t]*([-=*_~])\1{2,}[ \t]*$", re.MULTILINE)
_LAST_SENTENCE = re.compile(r"(?<=[.!?:])[\"')\]]*\s+(?=[A-Z\"'(\[`])")
_LINE = re.compile(r"[^\n]+")
_LEAD_IN_CHARS = 400  # a lead-in is a sentence or two, not a page
_SHORT_PARAGRAPH_CHARS = 300  # a trailing instruction or a short opening line
_LONG_PARAGRAPH_CHARS = 600  # material, not instructions
_LEAD_IN_WINDOW = 3000  # the announcing line comes before this many characters of instructions
_CHAIN_CHARS = 1000  # a later announcing line this close to the first one replaces it
_QUESTION_CHARS = 600  # a question longer than this is not told apart with confidence


@dataclass(frozen=True, slots=True)
class Frame:
    start: int  # the material is text[start:end]; what is outside stays byte-identical
    end: int
    question: str  # the text's own question ("" when it has none), to score the material against


def _paragraphs(text: str, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    end = len(text) if end is None else end
    spans, pos = [], start
    for m in _PARAGRAPH_BREAK.finditer(text, start, end):
        spans.append((pos, m.start()))
        pos = m.end()
    spans.append((pos, end))
    return [(s, e) for s, e in spans if text[s:e].strip()]


def find_question(text: str) -> tuple[int, str] | None:
    """Where the question of a user text starts, and the question; None when it cannot be told apart."""
    markers = list(_MARKER.finditer(text))
    if markers and len(text) - markers[-1].start() <= _QUESTION_CHARS * 2:
        start = markers[-1].start()
        return start, text[start:].strip()
    paragraphs = _paragraphs(text)
    if len(paragraphs) >= 2:
        start, end = paragraphs[-1]
        last = text[start:end].strip()
        if len(last) <= _QUESTION_CHARS and (last.endswith("?") or _REQUEST.match(last)):
            return start, last
    stripped = text.rstrip()
    if stripped.endswith("?"):
        cuts = [m.end() for m in _LAST_SENTENCE.finditer(stripped, max(0, len(stripped) - _QUESTION_CHARS))]
        if cuts and len(stripped) - cuts[-1] <= _QUESTION_CHARS:
            return cuts[-1], stripped[cuts[-1] :]
    return None


def lead_in_end(text: str, start: int, end: int, required: bool) -> int | None:
    """End of the lead-in (the instructions and the line announcing the material) in text[start:end].

    The lead-in is the first announcing line in the text's first `_LEAD_IN_WINDOW` characters, moved
    on to a later one that follows within `_CHAIN_CHARS` with no long paragraph between ("Rules for
    the documents:" + a short list + "Documents:"). Without one: `start` when `required` is off (a
    short opening paragraph is still kept), None when it is on (a system prompt whose material is
    not announced cannot be split safely)."""
    paragraphs = _paragraphs(text, start, end)
    found = None
    for s, e in paragraphs[:-1]:
        if found is not None and (e - s > _LONG_PARAGRAPH_CHARS or s - found > _CHAIN_CHARS):
            break
        if found is None and s - start > _LEAD_IN_WINDOW:
            break
        lines = [(s + m.start(), s + m.end()) for m in _LINE.finditer(text[s:e])]
        for i, (line_start, line_end) in enumerate(lines):
            line = text[line_start:line_end].strip()
            closes = line_end == e or (i + 1 < len(lines) and _SEPARATOR.fullmatch(text, *lines[i + 1]) is not None)
            if len(line) <= _LEAD_IN_CHARS and _announces(line, closes) and (found is None or line_start - found <= _CHAIN_CHARS):
                found = line_end
    if found is not None or required:
        return found
    if len(paragraphs) >= 2 and paragraphs[0][1] - paragraphs[0][0] <= _SHORT_PARAGRAPH_CHARS:
        return paragraphs[0][1]
    return start


def _announces(line: str, ends_block: bool) -> bool:
    """A line that introduces material: `Context:`, `## Sources`, or (closing its paragraph, or followed
    by a separator line) a sentence such as "Use the following documents to answer."."""
    if line.endswith(":") or _HEADING.match(line):
        return bool(_NAMES_MATERIAL.search(line))
    return ends_block and bool(_ANNOUNCES.search(line))


def fenced(text: str, start: int, end: int) -> tuple[int, int]:
    """Narrow text[start:end] to what a pair of separator lines fences: the material must open with
    one, and the closing one must leave no more than a short instruction after it (a heading's
    underline inside the material is neither)."""
    opening = _SEPARATOR.match(text, start + len(text[start:end]) - len(text[start:end].lstrip()))
    if opening is None:
        return start, end
    lines = list(_SEPARATOR.finditer(text, opening.end(), end))
    if lines and end - lines[-1].end() <= _SHORT_PARAGRAPH_CHARS:
        return opening.end(), lines[-1].start()
    return opening.end(), end


def user_frame(text: str, latest: bool) -> Frame | str:
    """The material of a user text, or the reason it is left whole.

    The latest turn must have a question that can be told apart (it is what the model answers);
    an earlier turn may have none (the material was pasted, the question came in a later turn)."""
    found = find_question(text)
    if found is None and latest:
        return "no_question"
    end, question = found if found is not None else (len(text), "")
    start = lead_in_end(text, 0, end, required=False)
    assert start is not None
    start, end = fenced(text, start, end)
    return Frame(start, end, question)


def system_frame(text: str) -> Frame | str:
    """The material of a system prompt after its instructions, or the reason it is left whole."""
    start = lead_in_end(text, 0, len(text), required=True)
    if start is None:
        return "no_lead_in"
    end = len(text)
    paragraphs = _paragraphs(text, start)
    if len(paragraphs) >= 2 and paragraphs[-1][1] - paragraphs[-1][0] <= _SHORT_PARAGRAPH_CHARS:
        end = paragraphs[-1][0]  # a closing instruction ("Answer only from the context above.")
    start, end = fenced(text, start, end)
    return Frame(start, end, "")
