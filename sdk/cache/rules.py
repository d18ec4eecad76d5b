"""Lexical checks for near-misses that sentence embeddings barely see.

MiniLM places "flights from Paris to London" and "... from London to Paris", or "under $50" and
"under $500", within a few hundredths of cosine. Three differences are hard vetoes, because serving
a cached answer across them is wrong whatever the model says: different numbers (digits or number
words), a negation on one side only, and the same key words moved across a directional word
("to", "than", "from", ...: swapped entities). Softer differences (an entity or constraint word on
one side only, overlap, length) are features of the learned verifier instead.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?|\d+(?:[.,]\d+)*")
_NUMBER_WORDS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
    "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "twenty": "20", "thirty": "30",
    "forty": "40", "fifty": "50", "hundred": "100", "thousand": "1000", "million": "1000000", "billion": "1000000000",
    "first": "1", "second": "2", "third": "3", "half": "0.5", "double": "2x", "twice": "2x", "once": "1x",
}  # fmt: skip
_NEGATIONS = frozenset({"not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "without", "cannot", "cant", "dont", "doesnt", "isnt", "arent", "wasnt", "werent", "wont", "shouldnt", "couldnt", "wouldnt", "didnt", "havent", "hasnt"})
_STOP = frozenset(
    "a an the is are was were be been being am do does did can could should would will shall may might must i me my "
    "you your we our he she it its they them their this that these those what which who whom whose how why when where "
    "of in on at to for from by with about as into than then so and or but if there here some any all best good way ways "
    "get make much many more most very just also really quora".split()
)
_DIRECTIONAL = ("to", "from", "than", "into", "over", "against", "before", "after", "vs")


@dataclass(frozen=True, slots=True)
class RuleCheck:
    numbers_differ: bool
    negation_differs: bool
    swapped: bool
    jaccard: float  # content-word overlap
    only_a: int  # content words only on one side
    only_b: int
    entity_diff: int  # capitalised words (names, places, products) on one side only
    length_ratio: float

    @property
    def veto(self) -> bool:
        return self.numbers_differ or self.negation_differs or self.swapped

    def vector(self) -> np.ndarray:
        return np.array(
            [self.numbers_differ, self.negation_differs, self.swapped, self.jaccard, min(self.only_a, 5) / 5, min(self.only_b, 5) / 5, min(self.entity_diff, 3) / 3, self.length_ratio],
            dtype=np.float32,
        )


def _tokens(text: str) -> list[str]:
    return _WORD.findall(text)


def _numbers(words: list[str]) -> Counter[str]:
    found: Counter[str] = Counter()
    for word in words:
        low = word.lower()
        if low[0].isdigit():
            found[low.replace(",", "")] += 1
        elif low in _NUMBER_WORDS:
            found[_NUMBER_WORDS[low]] += 1
    return found


def _negated(words: list[str]) -> bool:
    return any(w.lower().replace("'", "") in _NEGATIONS or w.lower().endswith("n't") for w in words)


def _content(words: list[str]) -> list[str]:
    return [w.lower() for w in words if w.lower() not in _STOP and w.lower() not in _NEGATIONS and not w[0].isdigit()]


def _entities(words: list[str]) -> set[str]:
    # Capitalised words past the first: the first word of a question is capitalised anyway.
    return {w.lower() for w in words[1:] if w[0].isupper() and w.lower() not in _STOP}


def _sides_differ(wa: list[str], wb: list[str]) -> bool:
    """Same words on the other side of a directional word: "Paris to London" / "London to Paris",
    "Python faster than Java" / "Java faster than Python". Symmetric phrasings ("between X and Y",
    "X or Y", plain reordering) do not count: on QQP those are mostly true duplicates."""
    la, lb = [w.lower() for w in wa], [w.lower() for w in wb]
    for marker in _DIRECTIONAL:
        if la.count(marker) == 1 and lb.count(marker) == 1:
            before_a, before_b = set(_content(wa[: la.index(marker)])), set(_content(wb[: lb.index(marker)]))
            if before_a != before_b:
                return True
    return False


def check(a: str, b: str) -> RuleCheck:
    wa, wb = _tokens(a), _tokens(b)
    ca, cb = _content(wa), _content(wb)
    sa, sb = set(ca), set(cb)
    union = sa | sb
    swapped = sa == sb and _sides_differ(wa, wb)
    entities_a, entities_b = _entities(wa), _entities(wb)
    entity_diff = len({e for e in entities_a ^ entities_b if e not in sa or e not in sb})
    return RuleCheck(
        numbers_differ=_numbers(wa) != _numbers(wb),
        negation_differs=_negated(wa) != _negated(wb),
        swapped=swapped,
        jaccard=len(sa & sb) / len(union) if union else 1.0,
        only_a=len(sa - sb),
        only_b=len(sb - sa),
        entity_diff=entity_diff,
        length_ratio=min(len(wa), len(wb)) / max(len(wa), len(wb), 1),
    )
