"""Find content that changes between requests inside what should be the stable prefix.

Two detectors, both line-based over the system prompt (and tool descriptions, report-only):
- patterns: timestamps, times of day, UUIDs, request/session/trace ids, epoch seconds, counters
  ("turn 12"); a bare date changes only daily, so alone it is reported but not moved;
- learning: within one conversation (same first user message) the system prompt should not change;
  a line that does is remembered by its label (first words, digits masked), e.g. "The user's name is
  Alice" / "... Bob", and treated as volatile while it keeps changing: judged over its last
  `LEARN_WINDOW` comparisons, volatile when it changed in more than `VOLATILE_SHARE` of them. A change
  back to a line the text had lately (`RECENT_VALUES`: two prompt variants in turn under one opening
  message, an A/B test) counts as no change: that prefix was sent lately and may still be cached. A
  line that changed once (a new prompt version, `v0 ...` -> `v1 ...`) and is then seen unchanged earns
  its breakpoints back; one learned for good after a single change left a team with no prompt caching.

Analysis of a text is memoised by digest, so an unchanged system prompt costs one dict lookup. The
memo, and the lines each conversation last sent, are the team's but live in the process every team
shares: bounded in what they hold (`MEMO_COST`, `LEARN_LINES`), not only in entries, and an analysis
keeps no unscanned tail (it kept a copy of every large text's rest, up to the team's body limit, for
4,096 texts).

Every pattern here runs on client text on the event loop, so each is linear in its input and the
input is bounded: lines are searched in their first `MAX_LINE_CHARS`, and a text only in its first
`MAX_SCAN_CHARS` (the rest is one opaque tail line that is never reported or moved). Volatile lines
sit near the top of a system prompt in practice (date, user, ids); the optimizer also caps what one
request may scan in all (`SCAN_BUDGET_CHARS`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sdk.lru import LRU

MAX_LINE_CHARS = 1024
MAX_SCAN_CHARS = 32 * 1024
SCAN_BUDGET_CHARS = 64 * 1024  # per request, over every text scanned (sdk/promptcache/optimizer.py)
MEMO_COST = 16 << 20  # what a team's memo of analyses may hold: characters kept, and LINE_COST a line
LINE_COST = 128  # a line's label, digest, kind and places in the analysis' tuples, about
LEARN_LINES = 256  # lines of a text compared within a conversation (volatile lines sit near the top)
LEARN_WINDOW = 4  # a learned line's latest comparisons within a conversation that judge it
# Changed in more than this share of them: volatile. The break-even of caching a prefix that changes with
# probability p on Anthropic's prices (writes 1.25x, reads 0.1x the input price): marking it saves 0.9 of the
# input when it is read again, (1 - p) * 0.9, and costs 0.25 more when it changed, p * 0.25: worth it below
# p = 0.9 / 1.15, about 0.78. So with four comparisons, only a line that changed in all of them is volatile.
VOLATILE_SHARE = 0.75
RECENT_VALUES = 2 * LEARN_WINDOW  # a text's lines lately changed from or to, whose prefixes may still be cached


class _RequestId:
    """`request_id: 8f3a91c2`, `session-7Gh2kq9d`, `trace=abc123xyz`: a keyword, then a token with a digit
    followed by at least five more token characters.

    As one regex (`keyword[A-Za-z0-9_-]*\\d[A-Za-z0-9_-]{5,}`) this is quadratic: on `req-req-req-…`
    every keyword start rescans the rest of the run (13 s on 16 KB). Here each token is read once,
    plus at most its last few characters (see `search`).
    """

    _KEY = re.compile(r"\b(?:request|req|session|sess|trace|span|run|conversation|conv|msg|call|correlation)", re.I)
    # Possessive whitespace (Python 3.11+): the token holds no space, so how two runs split one never matters.
    _VALUE = re.compile(r"[ _-]?(?:id)?\s*+[:=#]?\s*+[\"']?([A-Za-z0-9_-]+)", re.I)
    _ID = re.compile(r"\d[A-Za-z0-9_-]{5}")
    _LONGEST_KEY = len("conversation_id")

    def search(self, line: str) -> bool:
        pos = 0
        while (key := self._KEY.search(line, pos)) is not None:
            value = self._VALUE.match(line, key.end())
            if value is None:
                pos = key.end()
                continue
            if self._ID.search(value.group(1)):
                return True
            # A keyword inside this token sees only a suffix of it, unless the keyword (and its `_id`)
            # ends where the token ends: then a space may lead it to a new token. Only those are re-read.
            pos = max(key.end(), value.end() - self._LONGEST_KEY)
        return False


_PATTERNS: tuple[tuple[str, re.Pattern[str] | _RequestId], ...] = (
    ("uuid", re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")),
    ("timestamp", re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}")),
    ("timestamp", re.compile(r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*,? \d{1,2} [A-Z][a-z]{2,8} \d{4} \d{1,2}:\d{2}")),
    ("time", re.compile(r"\b\d{1,2}:\d{2}:\d{2}\b|\b\d{1,2}:\d{2}\s?(?:[AaPp][Mm]|UTC|GMT)\b")),
    ("request_id", _RequestId()),
    ("hex_id", re.compile(r"\b[0-9a-f]{16,}\b")),
    ("epoch", re.compile(r"\b1[5-9]\d{8}(?:\d{3})?\b")),
    ("counter", re.compile(r"\b(?:turn|request|attempt|iteration|invocation)\s*(?:#|no\.|number|count|:)\s*\d+\b", re.I)),
    ("date", re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* \d{1,2},? \d{4}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b")),
)
ADVISORY_KINDS = frozenset({"date"})  # reported, moved only once learning confirms it varies
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True, slots=True)
class Finding:
    path: str  # where the content sits (system.0, messages.0, tools.3)
    line: int  # line number inside that text
    kind: str  # a pattern name, or "learned"
    excerpt: str  # the line, shortened
    movable: bool  # confident enough to move out of the prefix when reorder is on


@dataclass(frozen=True, slots=True)
class _Analysis:
    lines: tuple[str, ...]  # the scanned lines (an unscanned tail is not kept: `VolatilityDetector.lines` splits again)
    labels: tuple[str, ...]
    kinds: tuple[str | None, ...]  # pattern kind per scanned line (all but an unscanned tail)
    digests: tuple[int, ...]

    @property
    def cost(self) -> int:
        return sum(map(len, self.lines)) + LINE_COST * len(self.digests)


def _label(line: str) -> str:
    return _DIGITS.sub("#", " ".join(line[:256].split()[:3]).lower())[:48]


def excerpt(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _pattern_kind(line: str) -> str | None:
    line = line[:MAX_LINE_CHARS]
    for kind, pattern in _PATTERNS:
        if pattern.search(line):
            return kind
    return None


def _split(text: str) -> tuple[tuple[str, ...], bool]:
    """The lines of `text`; past MAX_SCAN_CHARS the rest is one tail line (True: the last line is that tail)."""
    if len(text) <= MAX_SCAN_CHARS:
        return tuple(text.split("\n")), False
    cut = text.rfind("\n", 0, MAX_SCAN_CHARS)
    if cut < 0:
        return (text,), True
    return (*text[:cut].split("\n"), text[cut + 1 :]), True


class VolatilityDetector:
    """Per-team detector; holds the learned labels and each conversation's last system prompt."""

    MAX_ANALYSES = 4096
    MAX_CONVERSATIONS = 4096
    MAX_LEARNED = 4096  # labels learned (volatile now or not), every path together; paths with recent values
    MAX_CHANGED_SHARE = 0.25  # more lines than this changed: a different prompt, not a volatile line

    def __init__(self) -> None:
        self._analyses: dict[int, _Analysis] = {}
        self._memo_cost = 0  # what the memo holds (`_Analysis.cost`), within MEMO_COST
        # (path, conversation) -> its text's line count, its first LEARN_LINES lines' digests, the rest's digest
        self._previous: LRU[tuple[str, int], tuple[int, tuple[int, ...], int]] = LRU(self.MAX_CONVERSATIONS)
        self.learned: dict[str, set[str]] = {}  # path -> labels volatile now (seen to vary within a conversation)
        # path -> label -> its latest comparisons (True: changed to a value not seen lately), at most LEARN_WINDOW
        self._windows: dict[str, dict[str, tuple[bool, ...]]] = {}
        self._values: dict[str, tuple[int, ...]] = {}  # path -> digests of the lines that changed there lately
        self._learned_count = 0  # labels in `_windows`, within MAX_LEARNED

    def forget_texts(self) -> None:
        """Let go of the memo of analyses and each conversation's last lines (what is learned stays)."""
        self._analyses.clear()
        self._memo_cost = 0
        self._previous = LRU(self.MAX_CONVERSATIONS)

    def _analyse(self, text: str) -> _Analysis:
        key = hash(text)  # cached on the string object
        found = self._analyses.get(key)
        if found is None:
            lines, has_tail = _split(text)
            scanned = lines[:-1] if has_tail else lines
            found = _Analysis(
                scanned,
                tuple(_label(line) for line in lines),
                tuple(_pattern_kind(line) for line in scanned),
                tuple(hash(line) for line in lines),
            )
            cost = found.cost
            if len(self._analyses) >= self.MAX_ANALYSES or self._memo_cost + cost > MEMO_COST:
                self._analyses.clear()
                self._memo_cost = 0
            if cost <= MEMO_COST:
                self._analyses[key] = found
                self._memo_cost += cost
        return found

    def _learn(self, path: str, conversation: int, analysis: _Analysis) -> None:
        key = (path, conversation)
        digests = analysis.digests
        now = (len(digests), digests[:LEARN_LINES], hash(digests[LEARN_LINES:]))
        before = self._previous.get(key)
        self._previous.put(key, now)
        windows = self._windows.get(path)
        # the same line count, and below the first LEARN_LINES the same lines: else nothing to learn from
        if before is None or (before == now and not windows) or before[0] != now[0] or before[2] != now[2]:
            return
        changed = [i for i, (a, b) in enumerate(zip(before[1], now[1], strict=True)) if a != b]
        if len(changed) > max(2, int(now[0] * self.MAX_CHANGED_SHARE)):
            return  # a different prompt, not a volatile line
        # A line changed back to a value this text had lately (two prompt variants in turn, an A/B test) ends a
        # prefix that was sent lately and may still be cached: no evidence of volatility.
        recent = self._values.get(path, ())
        varied: dict[str, bool] = {}  # label -> changed to a value not seen lately
        for i in changed:
            varied[analysis.labels[i]] = varied.get(analysis.labels[i], False) or digests[i] not in recent
        if changed:
            added = [before[1][i] for i in changed] + [digests[i] for i in changed]  # the newest last
            if path not in self._values and len(self._values) >= self.MAX_LEARNED:
                self._values.clear()
            self._values[path] = (*[v for v in recent if v not in added], *added)[-RECENT_VALUES:]
        if self._learned_count + len(varied.keys() - (windows or {}).keys()) > self.MAX_LEARNED:
            self.learned.clear()  # a team's labels, bounded as its memo is
            self._windows.clear()
            self._learned_count = 0
            windows = None
        for label, novel in varied.items():
            self._observe(path, label, novel)
        if windows:  # a learned line seen unchanged: evidence against its volatility
            compared = set(analysis.labels[:LEARN_LINES]) - varied.keys()
            for label in [label for label in windows if label in compared]:
                self._observe(path, label, False)

    def _observe(self, path: str, label: str, changed: bool) -> None:
        """One comparison of a line within a conversation: it changed to a value not seen lately, or not."""
        windows = self._windows.get(path)
        if not changed and (windows is None or label not in windows):
            return  # nothing learned of it
        if windows is None:
            windows = self._windows[path] = {}
        window = (*windows.get(label, ())[1 - LEARN_WINDOW :], changed)
        if label not in windows:
            self._learned_count += 1
        if any(window):
            windows[label] = window
        else:  # no change left in its window: forgotten (a change after this is judged as a new one's)
            del windows[label]
            self._learned_count -= 1
            if not windows:
                del self._windows[path]
        if sum(window) > VOLATILE_SHARE * len(window):
            self.learned.setdefault(path, set()).add(label)
        elif label in (volatile := self.learned.get(path, set())):
            volatile.remove(label)
            if not volatile:
                del self.learned[path]

    def scan(self, path: str, text: str, conversation: int | None, movable_section: bool = True) -> list[Finding]:
        """Volatile lines of one text; `conversation` (None: do not learn) identifies its thread."""
        analysis = self._analyse(text)
        if conversation is not None and movable_section:
            self._learn(path, conversation, analysis)
        learned = self.learned.get(path, ())
        findings = []
        for i, kind in enumerate(analysis.kinds):
            is_learned = bool(learned) and analysis.labels[i] in learned
            if kind is None and not is_learned:
                continue
            movable = movable_section and (is_learned or kind not in ADVISORY_KINDS)
            findings.append(Finding(path, i, kind or "learned", excerpt(analysis.lines[i]), movable))
        return findings

    def lines(self, text: str) -> tuple[str, ...]:
        """Every line of `text`, as `scan` numbered them (an unscanned tail the last): for moving some."""
        return _split(text)[0]
