"""Protected items: what a compressed document must still mention.

Pruning drops whole units, so an item survives when one unit that mentions it is kept. The selector
covers every item first (the most relevant unit mentioning it); when covering them does not fit the
budget, the document's compression is refused, not silently lossy.

Kinds (policy `protect`; the default is the first four):
- `query`: what the question refers to — its specific items (below, plus inline code, dotted and
  snake_case names, capitalized words) wherever they occur, and its ordinary words where the document
  mentions them rarely. Items the instructions around the material name count too.
- `quantities`, `codes`, `names`: rare specific tokens — numbers with a unit (`45 minutes`, `$120`,
  `25%`, dates and times), identifiers that mix letters and digits (`CVE-2021-44228`, `E1234`,
  `RFC 7231`, `v3.12.1`, hashes, addresses), and proper names (a capitalized run mid-sentence whose
  lower-case form the document never uses). Only items mentioned in at most `RARE_UNITS` units count:
  what a document says often is not specific, and one of its mentions survives anyway.
- `numbers`, `identifiers`, `entities`: the broad patterns of the first version (every number, every
  snake_case/camelCase/dotted name, every capitalized word mid-sentence). They protect nearly every
  sentence of technical prose and so refuse most documents at useful ratios; kept for teams that want
  that.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Iterable
from typing import Literal

ProtectKind = Literal["query", "quantities", "codes", "names", "numbers", "identifiers", "entities"]
DEFAULT_PROTECT: tuple[ProtectKind, ...] = ("query", "quantities", "codes", "names")
RARE_UNITS = 2  # a specific item mentioned in more units than this is not protected
RARE_QUERY_UNITS = 3  # an ordinary word of the question is protected where at most this many units mention it

_UNITS = (
    r"%|percent|ms|milliseconds?|s|secs?|seconds?|min|mins|minutes?|h|hrs?|hours?|days?|weeks?|months?|years?|"
    r"[KMGTP]i?B|kB|bytes?|bits?|[kMG]?Hz|[kMG]?bps|°[CF]|mm|cm|m|km|kg|g|mg|lbs?|V|W|kW|kWh|mAh|px|pt|"
    r"USD|EUR|GBP|requests?|users?|rows?|records?|items?|tokens?|retries|attempts|replicas|nodes|cores|"
    r"threads|connections|workers|GPUs?|CPUs?|calls|queries|messages|files|pages|characters|chars|lines"
)
# The specific kinds are classified token by token. Candidates are found by patterns that start with
# a plain character class or literal (the regex engine then skips ahead to it; an alternation or a
# lookbehind tried at every position was 10x slower): the rest of a token from its first digit, a
# URL, an e-mail address's domain; each is widened back to the start of its whitespace-delimited token.
_DIGIT_TOKEN = re.compile(r"\d\S*")
_URL = re.compile(r"https?://[^\s)>\]]+")
_MAIL_DOMAIN = re.compile(r"@[\w-]+(?:\.[\w-]+)+")
_QUANTITY = re.compile(
    r"[$€£¥]\d[\d,]*(?:\.\d+)?"  # money
    r"|\d{4}-\d{2}-\d{2}"  # ISO dates
    r"|\d{1,2}:\d{2}(?::\d{2})?(?:am|pm)?"  # times
    rf"|\d[\d,]*(?:\.\d+)?-?(?:{_UNITS})"  # 25%, 16GiB, 45-minute
)
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?|\d{1,2}:\d{2}(?::\d{2})?")
_UNIT_AFTER = re.compile(rf"[ \t]?(?:[a-z]+[ \t])?(?:{_UNITS}|UTC|GMT|am|pm)(?!\w)")  # "45 operating hours"
_CODE = re.compile(
    r"v?\d+\.\d+\.\d+(?:[-.][0-9A-Za-z]+)*"  # versions with three parts
    r"|\d{1,3}(?:\.\d{1,3}){3}"  # IPv4
    r"|[A-Za-z]+(?:-[A-Za-z0-9]+)*-\d[\w-]*"  # hyphenated codes: CVE-2021-44228, SKU-4471-B
    r"|(?=[A-Z0-9_]*\d)(?=[A-Z0-9_]*[A-Z])[A-Z0-9_]{3,}"  # upper case with digits: E1234, X9Z
    r"|(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}"  # hex ids and hashes
)
_STANDARD_BEFORE = re.compile(r"\b(?:RFC|PEP|ISO|IEC|IEEE|CVE|KB|ECMA)[ -]?$")  # "RFC 7231", "PEP 8"
_LEADING = "([\"'<"
_PATTERNS: dict[str, re.Pattern[str]] = {
    # A capitalized run after a lower-case word (so not a sentence start): "Halvorsen", "New York".
    "names": re.compile(r"[A-Z][^\W\d_A-Z]+(?:[ -](?:of |de |van |von |la )?[A-Z][^\W\d_A-Z]+)*"),  # mid-sentence only: _after_word
    # The first version's broad patterns (opt-in).
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
    "entities": re.compile(r"(?<=[a-z,;:] )[A-Z][a-z]+(?: (?:of |de |van |von )?[A-Z][a-z]+)*"),
}
# What a question names specifically: the specific kinds, code-like names, and any capitalized word.
_ASKED = re.compile(
    r"`([^`\n]{1,80})`"
    r"|\b([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+|[A-Za-z]*_\w+|[a-z]+[A-Z]\w*)"
    r"|(?<![\w'])([A-Z][\w-]*[A-Za-z0-9])"
)
_SPECIFIC = ("quantities", "codes", "names")
_TRAILING = ".,:;!?'\""
_LABEL = {"numbers": "number", "identifiers": "identifier", "entities": "entity", "quantities": "quantity", "codes": "code", "names": "name", "query": "asked"}
_WORD = re.compile(r"[a-z0-9_]+")


def find_items(text: str, kinds: Iterable[str]) -> set[str]:
    """The distinct pattern-found items in `text` (each prefixed by its kind, so reports say what it was)."""
    return {f"{_LABEL[kind]}:{text[start:end]}" for kind, start, end in _matches(text, kinds)}


def unit_items(text: str, starts: list[int], unit_words: list[set[str]], kinds: Iterable[str], query: str, instructions: str) -> list[frozenset[str]]:
    """The protected items of each unit of a document (units start at `starts` in `text`).

    `unit_words` are each unit's lower-case words (the scorer's; empty for code units, which are
    kept anyway); `query` is the question, `instructions` the text around the material. Each pattern runs once over the whole text; matches map to units by offset."""
    kinds = tuple(kinds)
    per_unit: list[set[str]] = [set() for _ in starts]
    for kind, s, e in _matches(text, [k for k in kinds if k != "query"]):
        i = bisect.bisect_right(starts, s) - 1
        if i >= 0 and unit_words[i]:
            per_unit[i].add(f"{_LABEL[kind]}:{text[s:e]}")
    rare = {_LABEL[kind] for kind in kinds if kind in _SPECIFIC}
    if rare:
        mentions = Counter(item for items in per_unit for item in items if item.split(":", 1)[0] in rare)
        used_lower = set().union(*unit_words) if "names" in kinds else set()
        for items in per_unit:
            items -= {item for item in items if item.split(":", 1)[0] in rare and (mentions[item] > RARE_UNITS or _common_name(item, used_lower))}
    if "query" in kinds:
        _add_asked(text, starts, unit_words, per_unit, query, instructions)
    return [frozenset(items) for items in per_unit]


def _common_name(item: str, used_lower: set[str]) -> bool:
    """A capitalized word the document also writes in lower case ("Note", "Returns") is not a name."""
    kind, _, name = item.partition(":")
    return kind == "name" and " " not in name and name.lower() in used_lower


def _add_asked(text: str, starts: list[int], unit_words: list[set[str]], per_unit: list[set[str]], query: str, instructions: str) -> None:
    """Items the question names (specific tokens, code-like names, capitalized words) or the
    instructions name (specific tokens and code-like names only), and the question's ordinary words
    where few units mention them."""
    specific = {query[s:e] for _, s, e in _matches(query, _SPECIFIC)} | {instructions[s:e] for _, s, e in _matches(instructions, _SPECIFIC)}
    specific |= {next(g for g in m.groups() if g) for m in _ASKED.finditer(query)}
    specific |= {m.group(1) or m.group(2) for m in _ASKED.finditer(instructions) if m.group(1) or m.group(2)}
    lowered = text.lower()
    for item in sorted(s for s in specific if len(s) >= 2):
        needle = item.lower()
        if _WORD.fullmatch(needle):  # one word: match whole words (the scorer's words)
            hits = [i for i, words in enumerate(unit_words) if needle in words]
        else:  # a phrase, code or figure: match the text
            hits, at = [], lowered.find(needle)
            while at >= 0:
                hits.append(bisect.bisect_right(starts, at) - 1)
                at = lowered.find(needle, at + len(needle))
        for i in hits:
            if i >= 0 and unit_words[i]:
                per_unit[i].add(f"asked:{item}")
    asked = set(_WORD.findall(query.lower())) & set().union(*unit_words)
    df = Counter(w for words in unit_words for w in asked & words)
    for word in asked:
        if 0 < df[word] <= RARE_QUERY_UNITS and len(word) >= 3:
            for i, words in enumerate(unit_words):
                if word in words:
                    per_unit[i].add(f"asked:{word}")


def _matches(text: str, kinds: Iterable[str]) -> list[tuple[str, int, int]]:
    kinds = tuple(kinds)
    found = _specific(text, "quantities" in kinds, "codes" in kinds) if "quantities" in kinds or "codes" in kinds else []
    for kind in kinds:
        pattern = _PATTERNS.get(kind)
        if pattern is None:
            continue
        for match in pattern.finditer(text):
            start, item = match.start(), match.group().rstrip(_TRAILING)
            if kind == "names" and not _after_word(text, start):
                continue
            while item[-1:] in (")", "]") and item.count(item[-1]) > item.count("(" if item[-1] == ")" else "["):
                item = item[:-1].rstrip(_TRAILING)  # a closing bracket of the prose, not of the item
            if item:
                found.append((kind, start, start + len(item)))
    return found


def _specific(text: str, quantities: bool, codes: bool) -> list[tuple[str, int, int]]:
    """Quantities and codes, token by token (see _DIGIT_TOKEN)."""
    found = []
    for match in _DIGIT_TOKEN.finditer(text):
        start = _token_start(text, match.start())
        start += len(text[start : match.start()]) - len(text[start : match.start()].lstrip(_LEADING))
        end = start + len(text[start : match.end()].rstrip(_TRAILING + ")]>"))
        if start >= end:
            continue
        if quantities and _NUMBER.fullmatch(text, start, end) and (unit := _UNIT_AFTER.match(text, end)):
            found.append(("quantities", start, unit.end()))
        elif quantities and _QUANTITY.fullmatch(text, start, end):
            found.append(("quantities", start, end))
        elif codes and _CODE.fullmatch(text, start, end):
            found.append(("codes", start, end))
        elif codes and (standard := _STANDARD_BEFORE.search(text, max(0, start - 6), start)):
            found.append(("codes", standard.start(), end))
    if codes:
        found.extend(("codes", m.start(), m.start() + len(m.group().rstrip(_TRAILING))) for m in _URL.finditer(text))
        found.extend(("codes", _token_start(text, m.start()), m.start() + len(m.group().rstrip(_TRAILING))) for m in _MAIL_DOMAIN.finditer(text))
    return found


def _after_word(text: str, at: int) -> bool:
    """Mid-sentence: a lower-case letter, comma or semicolon, then one space, before `at`."""
    return at >= 2 and text[at - 1] == " " and (text[at - 2].islower() or text[at - 2] in ",;")


def _token_start(text: str, at: int) -> int:
    return max(text.rfind(" ", 0, at), text.rfind("\n", 0, at), text.rfind("\t", 0, at)) + 1
