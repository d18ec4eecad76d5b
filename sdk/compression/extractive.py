"""Query-aware extractive pruning of one document: split, count, score, select, render.

`prepare` and `finish` are synchronous CPU work (run in a worker thread by the stage); scoring sits
between them so the contextual scorer can await the shared embedder without holding a thread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sdk.compression import tokens
from sdk.compression.budget import Candidate, render, select
from sdk.compression.protection import find_items
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
    gaps: list[str]  # whitespace before each unit, and after the last
    code: list[bool]
    counts: list[int]
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
    return Prepared(text, units, gaps, [u.code for u in spans], counts, tokens.count(text))


def finish(prepared: Prepared, scores: list[float], budget: Budget) -> Outcome:
    candidates = [
        Candidate(text, count, score, code, frozenset(find_items(text, budget.protect)) if not code else frozenset())
        for text, count, score, code in zip(prepared.units, prepared.counts, scores, prepared.code, strict=True)
    ]
    code = sum(count for count, is_code in zip(prepared.counts, prepared.code, strict=True) if is_code)
    target = budget.prose_tokens(sum(prepared.counts) - code, code)
    selection = select(candidates, target, budget.neighbours)
    unchanged = Outcome(prepared.text, prepared.total, prepared.total, selection.refused, [])
    if not selection.accepted or all(selection.keep):
        return unchanged
    text = render(prepared.units, prepared.gaps, selection.keep, budget.marker)
    after = tokens.count(text)
    if after >= prepared.total:  # markers cost more than what was dropped: keep the original
        return unchanged
    removed = [unit for unit, kept in zip(prepared.units, selection.keep, strict=True) if not kept]
    return Outcome(text, prepared.total, after, [], removed)
