"""Query-aware extractive pruning of one document: split, count, score, select, render.

`prepare` and `finish` are synchronous CPU work (run in a worker thread by the stage); scoring sits
between them so the contextual scorer can await the shared embedder without holding a thread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sdk.compression import tokens
from sdk.compression.budget import Candidate, render, select
from sdk.compression.protection import unit_items
from sdk.compression.scoring import words
from sdk.compression.splitting import split_units


@dataclass(frozen=True, slots=True)
class Budget:
    ratio: float  # keep at most this share of a document's prose tokens (code blocks are always kept)
    max_tokens: int | None  # and at most this many tokens of the whole document
    neighbours: bool
    marker: str
    protect: tuple[str, ...]

    def prose_tokens(self, prose: int, code: int) -> int:
        """Prose tokens a document may keep; negative when its code alone exceeds `max_tokens`."""
        limit = math.floor(prose * self.ratio)
        return min(limit, self.max_tokens - code) if self.max_tokens is not None else limit


@dataclass(frozen=True, slots=True)
class Prepared:
    text: str
    units: list[str]
    starts: list[int]  # offset of each unit in `text`
    gaps: list[str]  # whitespace before each unit, and after the last
    code: list[bool]
    counts: list[int]
    words: list[list[str]]  # each unit's lower-case words without stop words (scoring and protection)
    total: int  # tokens of the whole document


@dataclass(frozen=True, slots=True)
class Outcome:
    text: str  # the compressed document, or the original when refused or not worth it
    before: int
    after: int
    refused: list[str]  # protected items that could not be kept within the budget
    removed: list[str]  # dropped units, for debug logs


def prepare(text: str) -> Prepared:
    spans = split_units(text)
    units = [u.text(text) for u in spans]
    ends = [0] + [u.end for u in spans]
    gaps = [text[ends[i] : spans[i].start] for i in range(len(spans))] + [text[ends[-1] :]]
    counts = tokens.count_many(units)
    # The whole document's count is the units' sum: the whitespace between units rarely adds a token,
    # and a second pass of the tokenizer over the document costs as much as the first.
    return Prepared(text, units, [u.start for u in spans], gaps, [u.code for u in spans], counts, [words(u) for u in units], sum(counts))


def finish(prepared: Prepared, scores: list[float], budget: Budget, query: str, instructions: str) -> Outcome:
    """Select and render. `query` is the question the scores rank against; `instructions` the text
    around the material (query-aware protection reads both)."""
    unit_words = [set(w) if not code else set() for w, code in zip(prepared.words, prepared.code, strict=True)]
    items = unit_items(prepared.text, prepared.starts, unit_words, budget.protect, query, instructions) if budget.protect else [frozenset()] * len(prepared.units)
    candidates = [
        Candidate(text, count, score, code, unit if not code else frozenset())
        for text, count, score, code, unit in zip(prepared.units, prepared.counts, scores, prepared.code, items, strict=True)
    ]
    code = sum(count for count, is_code in zip(prepared.counts, prepared.code, strict=True) if is_code)
    target = budget.prose_tokens(sum(prepared.counts) - code, code)
    selection = select(candidates, target, budget.neighbours)
    unchanged = Outcome(prepared.text, prepared.total, prepared.total, selection.refused, [])
    if not selection.accepted or all(selection.keep):
        return unchanged
    text = render(prepared.units, prepared.gaps, selection.keep, budget.marker)
    runs = sum(1 for i, kept in enumerate(selection.keep) if not kept and (i == 0 or selection.keep[i - 1]))
    after = sum(n for n, kept in zip(prepared.counts, selection.keep, strict=True) if kept) + runs * tokens.count(budget.marker)
    if after >= prepared.total:  # markers cost more than what was dropped: keep the original
        return unchanged
    removed = [unit for unit, kept in zip(prepared.units, selection.keep, strict=True) if not kept]
    return Outcome(text, prepared.total, after, [], removed)
