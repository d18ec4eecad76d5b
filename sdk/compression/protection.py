"""Protected items: numbers, identifiers and named entities a compressed document must still contain.

Pruning drops whole units, so an item survives when at least one unit that mentions it is kept. The
selector covers every item first (preferring the most relevant unit that mentions it); when covering
them does not fit the budget, the document's compression is refused, not silently lossy.

Detection is by pattern, not by a tagger: cheap, predictable, and biased toward protecting too much.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

ProtectKind = Literal["numbers", "identifiers", "entities"]

_PATTERNS: dict[str, re.Pattern[str]] = {
    # 42, 3.14, 1,000, 2026-05-01, 10:30, v3.12.1, 25% — compared without trailing punctuation.
    "numbers": re.compile(r"(?<![\w.])[-+]?\d(?:[\d,.:/-]*\d)?%?"),
    "identifiers": re.compile(
        r"`[^`\n]{1,80}`"  # inline code
        r"|\bhttps?://\S+"  # URLs
        r"|(?:~|\.{1,2})?(?:/[\w.-]+){2,}/?"  # paths
        r"|\b[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?:\(\))?"  # dotted names: os.path.join, a.b()
        r"|\b[A-Za-z]*_\w*"  # snake_case, __init__, _private
        r"|\b[a-z]+[A-Z]\w*"  # camelCase
        r"|\b[A-Z][a-z0-9]+[A-Z]\w*"  # PascalCase with an inner capital: TypeError, HttpClient
        r"|\b[A-Z][A-Z0-9]{2,}\b"  # ACRONYMS, HTTP2, E1234
        r"|\b\w+\(\)"  # calls: len()
    ),
    # Capitalized words in mid-sentence (after a lower-case word), runs kept together: "New York".
    "entities": re.compile(r"(?<=[a-z,;:] )[A-Z][a-z]+(?: (?:of |de |van |von )?[A-Z][a-z]+)*"),
}
_TRAILING = ".,:;!?'\""
_LABEL = {"numbers": "number", "identifiers": "identifier", "entities": "entity"}


def find_items(text: str, kinds: Iterable[str]) -> set[str]:
    """The distinct protected items in `text` (each prefixed by its kind, so reports say what it was)."""
    return {f"{_LABEL[kind]}:{text[start:end]}" for kind, start, end in _matches(text, kinds)}


def protected_spans(text: str, kinds: Iterable[str]) -> list[tuple[int, int]]:
    """Character spans of protected items (token pruning must not cut into them)."""
    return [(start, end) for _, start, end in _matches(text, kinds)]


def _matches(text: str, kinds: Iterable[str]) -> list[tuple[str, int, int]]:
    found = []
    for kind in kinds:
        for match in _PATTERNS[kind].finditer(text):
            start, item = match.start(), match.group().rstrip(_TRAILING)
            while item[-1:] in (")", "]") and item.count(item[-1]) > item.count("(" if item[-1] == ")" else "["):
                item = item[:-1].rstrip(_TRAILING)  # a closing bracket of the prose, not of the item
            if item:
                found.append((kind, start, start + len(item)))
    return found
