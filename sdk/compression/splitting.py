"""Split a document into units (sentences, list items, code blocks) that pruning keeps or drops whole.

Units are spans into the original text, so whatever is kept is reproduced byte for byte; nothing is
rephrased. Code blocks are single units marked `code` and are always kept: a half-kept code block is
worse than none, and code is where exact tokens matter most.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Fenced code (``` or ~~~) up to its closing fence, or to the end of the text when it is unclosed.
_FENCE = re.compile(r"^(```|~~~)[^\n]*\n.*?(?:^\1[ \t]*$|\Z)", re.MULTILINE | re.DOTALL)
# An indented block: consecutive lines starting with 4 spaces or a tab (after a blank line).
_INDENTED = re.compile(r"(?:(?<=\n\n)|\A)(?:(?:    |\t)[^\n]*(?:\n|\Z)|[ \t]*\n(?=    |\t))+")
# Sentence ends: . ! ? (optionally closed by quotes/brackets) followed by space and a likely start.
# Not after a title or a common abbreviation ("Dr. Lindqvist", "e.g. Foo"): that is no sentence end.
_SENTENCE_END = re.compile(
    r"(?<=[.!?])(?<!\bDr\.)(?<!\bMr\.)(?<!\bMs\.)(?<!\bMrs\.)(?<!\bProf\.)(?<!\bSt\.)(?<!\bNo\.)(?<!\bvs\.)"
    r"(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\bcf\.)(?<!\bFig\.)[\"')\]]*\s+(?=[A-Z0-9\"'(\[*`_-])"
)
# Code pasted without a fence or indentation: a paragraph whose lines mostly read as code.
_CODE_LINE = re.compile(
    r"\s*(?:"
    r"(?:def|class|if|elif|else|for|while|with|try|except|finally|async def)\b[^\n]*:"  # Python block openers
    r"|from\s+[\w.]+\s+import\b.*|import\s+[\w.]+(?:\s*,\s*[\w.]+)*(?:\s+as\s+\w+)?"
    r"|@\w[\w.]*(?:\(.*\))?"  # decorators
    r"|.*[;{}]"  # C-like statements and braces
    r"|[}\])]+[;,)]*"
    r"|\"[^\"\n]+\"\s*:.*"  # JSON / YAML keys
    r"|[A-Za-z_][\w.\[\]\"']*\s*[-+*/%|&]?=\s*\S.*"  # assignments
    r"|[\w.]+\([^()\n]*\)"  # a call on its own line
    r")\s*"
)
_PARAGRAPH = re.compile(r"[^\n]+(?:\n[^\n]*\S[^\n]*)*")
CODE_LINE_SHARE = 0.6
_BLOCK_BREAK = re.compile(r"\n\s*\n|\n(?=\s*(?:[-*+•]|\d+[.)])\s)")  # paragraphs and list items
_WORD_GAP = re.compile(r"\s+")
MAX_UNIT_CHARS = 400  # ~100 tokens: longer runs (tables, logs) are cut at line or word gaps


@dataclass(frozen=True, slots=True)
class Unit:
    start: int
    end: int
    code: bool = False

    def text(self, source: str) -> str:
        return source[self.start : self.end]


def split_units(text: str) -> list[Unit]:
    """Units covering every non-blank character of `text`, in order; whitespace between them is not a unit."""
    units: list[Unit] = []
    pos = 0
    for start, end in _code_spans(text):
        units.extend(_prose_units(text, pos, start))
        units.append(Unit(start, end, code=True))
        pos = end
    units.extend(_prose_units(text, pos, len(text)))
    return units


def _code_spans(text: str) -> list[tuple[int, int]]:
    spans = [m.span() for m in _FENCE.finditer(text)]
    for m in _INDENTED.finditer(text):
        if m.end() > m.start() and not any(s <= m.start() < e for s, e in spans):
            spans.append(m.span())
    for m in _PARAGRAPH.finditer(text):
        if not any(s <= m.start() < e for s, e in spans) and _looks_like_code(m.group()):
            spans.append(m.span())
    return sorted(spans)


def _looks_like_code(paragraph: str) -> bool:
    lines = [line for line in paragraph.split("\n") if line.strip()]
    return len(lines) >= 2 and sum(1 for line in lines if _CODE_LINE.fullmatch(line)) >= CODE_LINE_SHARE * len(lines)


def _prose_units(text: str, start: int, end: int) -> list[Unit]:
    units: list[Unit] = []
    for block_start, block_end in _pieces(text, start, end, _BLOCK_BREAK):
        for s, e in _pieces(text, block_start, block_end, _SENTENCE_END):
            units.extend(_cut_long(text, s, e))
    return units


def _pieces(text: str, start: int, end: int, separator: re.Pattern[str]) -> list[tuple[int, int]]:
    """Spans between separator matches within [start, end), trimmed of surrounding whitespace."""
    spans = []
    pos = start
    for m in separator.finditer(text, start, end):
        spans.append((pos, m.start()))
        pos = m.end()
    spans.append((pos, end))
    return [trimmed for s, e in spans if (trimmed := _trim(text, s, e))[0] < trimmed[1]]


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _cut_long(text: str, start: int, end: int) -> list[Unit]:
    if end - start <= MAX_UNIT_CHARS:
        return [Unit(start, end)]
    units = []
    while end - start > MAX_UNIT_CHARS:
        window = text[start : start + MAX_UNIT_CHARS]
        cut = window.rfind("\n")
        if cut < MAX_UNIT_CHARS // 2:
            gaps = [m.start() for m in _WORD_GAP.finditer(window)]
            cut = gaps[-1] if gaps and gaps[-1] >= MAX_UNIT_CHARS // 2 else MAX_UNIT_CHARS
        s, e = _trim(text, start, start + cut)
        if s < e:
            units.append(Unit(s, e))
        start = _trim(text, start + cut, end)[0]
    if start < end:
        units.append(Unit(start, end))
    return units
