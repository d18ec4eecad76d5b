"""Choose which units of a document to keep: protected items first, then relevance, within a budget.

Selection is deterministic (ties break by position), so the same document and question give the
same compressed text every time: a compressed document that sits in a cacheable prefix stays cached.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Units that begin by pointing back ("It", "This", "However", ...) read wrong without their predecessor.
_REFERS_BACK = re.compile(
    r"^(?:it|its|this|these|that|those|they|their|them|he|she|his|her|such|however|therefore|thus|"
    r"also|but|so|then|hence|otherwise|instead|here|there|both|each|the latter|the former|in this)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Candidate:
    text: str
    tokens: int
    score: float
    code: bool
    items: frozenset[str]


@dataclass(slots=True)
class Selection:
    keep: list[bool]
    refused: list[str] = field(default_factory=list)  # protected items that could not fit; empty when accepted

    @property
    def accepted(self) -> bool:
        return not self.refused


def select(units: list[Candidate], budget: int, neighbours: bool) -> Selection:
    """Keep code, cover protected items, then add units by relevance while `budget` (prose tokens) allows."""
    keep = [u.code for u in units]  # code blocks always stay (see splitting.py) and are not counted
    if budget < 0:
        return Selection(keep, refused=["code blocks alone exceed max_tokens"])
    by_score = sorted(range(len(units)), key=lambda i: (-units[i].score, i))
    used, over = _cover_items(units, keep, 0, budget, by_score)
    if over:
        return Selection(keep, refused=over)
    for i in by_score:
        if keep[i]:
            continue
        group = [i]
        if neighbours and i > 0 and not keep[i - 1] and _REFERS_BACK.match(units[i].text):
            group.insert(0, i - 1)
        cost = sum(units[j].tokens for j in group)
        if used + cost <= budget:
            for j in group:
                keep[j] = True
            used += cost
    return Selection(keep)


def _cover_items(units: list[Candidate], keep: list[bool], used: int, budget: int, by_score: list[int]) -> tuple[int, list[str]]:
    """Keep, for every protected item, the most relevant unit mentioning it; returns tokens used and
    the items that did not fit (sorted, for a stable report)."""
    covered: set[str] = set()
    for i, unit in enumerate(units):
        if keep[i]:
            covered |= unit.items
    over: set[str] = set()
    for i in by_score:
        missing = units[i].items - covered
        if not missing or keep[i]:
            continue
        keep[i] = True
        used += units[i].tokens
        covered |= units[i].items
        if used > budget:
            over |= missing
    return used, sorted(over)


def render(source_units: list[str], gaps: list[str], keep: list[bool], marker: str) -> str:
    """Kept units joined by their original separators; each run of dropped units becomes one marker.

    `gaps[i]` is the original whitespace before unit i, `gaps[n]` the whitespace after the last one."""
    parts: list[str] = [gaps[0]]
    previous: bool | None = None  # was the previous unit kept (None: no unit yet)
    for i, text in enumerate(source_units):
        if keep[i] or previous in (None, True):
            separator = gaps[i] if previous is not False and keep[i] else _gap(gaps[i])
            parts.append(separator if i else "")
            parts.append(text if keep[i] else marker)
        previous = keep[i]
    parts.append(gaps[-1])
    return "".join(parts)


def _gap(whitespace: str) -> str:
    return "\n" if "\n" in whitespace else " "
