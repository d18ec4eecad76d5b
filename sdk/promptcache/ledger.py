"""The prefixes a team has sent to each provider cache, to predict reads and explain misses.

A scope is one provider cache: (protocol, model, OpenAI prompt_cache_key); the provider's own scope
is the upstream workspace, which is fixed per team and route. Entries follow the provider's rules
(A.8, A.9, C.1): Anthropic writes only at breakpoints whose prefix reaches the model minimum, reads
look back 20 positions from each breakpoint, latest first; OpenAI caches every prefix from 1,024
tokens in 128-token steps. An entry becomes readable only once its writer's response has started
(`publish`), and TTL clocks run from the start of the request that wrote or read the entry.

The history keeps the last requests' block chains, so a request that reads less than a similar
earlier one did can be explained by the first block that differs: their blocks' text, so bounded in
characters for the team as well as in requests (`HISTORY_CHARS`). By count alone (32 requests in each
of 256 scopes) a team's history held the text of 8,192 whole requests, images' base64 too, in the
process every team shares, long after they had left the in-flight body budget.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from sdk.promptcache.blocks import Block, Layout
from sdk.promptcache.volatility import excerpt

LOOKBACK = 20
OPENAI_MIN, OPENAI_STEP = 1024, 128
OPENAI_TTL_S = 300.0  # in-memory retention is "5-10 min idle": predict the short end
TTL_S = {"5m": 300.0, "1h": 3600.0}
HISTORY_PER_SCOPE = 32  # requests a scope's history keeps
HISTORY_CHARS = 16 << 20  # block text a team's history keeps, every scope together (the oldest goes first)
# No provider cache entry outlives an hour (Anthropic's long TTL): a request older than that explains no
# miss, and its text was kept in the process every team shares however long its team stayed away.
HISTORY_TTL_S = 3600.0
# Entries one request writes or refreshes: OpenAI caches every prefix past 1,024 tokens, one entry a message,
# and a request of 200,000 short messages made 200,000 entries (seconds of the event loop every team shares,
# each kept for the TTL and sent to the shared ledger). Past this many, the first and last third of them and
# the rest spread evenly between (`spread`): a later request sharing a prefix reads the nearest one before it.
WRITES_PER_REQUEST = 192
_BLOCK_CHARS = 64  # a block's own share of what a snapshot holds, beside its text


@dataclass(slots=True)
class Entry:
    pos: int  # provider tokens through the block (calibrated estimate)
    ttl: float
    expires: float
    readable: bool
    ready: asyncio.Event | None  # set once the writer's response starts; fan-out siblings wait on it


@dataclass(slots=True)
class Prediction:
    hit: int = -1  # block whose entry should be read
    read: int = 0  # tokens expected to be read
    pending: Entry | None = None  # an in-flight write that would let this request read more


@dataclass(slots=True)
class Write:
    key: int
    entry: Entry
    created: bool


@dataclass(frozen=True, slots=True)
class Snapshot:
    chain: list[int]
    blocks: list[Block]
    reach: int  # last block whose prefix was cached, or could have been had nothing busted it
    reach_pos: int
    conversation: int
    chars: int = 0  # what it holds, counted against HISTORY_CHARS
    at: float = 0.0  # when its request started (wall clock): kept HISTORY_TTL_S


@dataclass(frozen=True, slots=True)
class Cause:
    kind: str  # tools_changed | system_changed | messages_changed | expired_or_evicted
    path: str
    excerpt: str
    lost_tokens: int  # tokens the similar earlier prefix had cached beyond the change

    @property
    def label(self) -> str:
        return f"{self.kind}@{self.path}" if self.path else self.kind


def _common_prefix(a: str, b: str) -> int:
    """Length of the common prefix, by halving: slices compare at C speed, so a 5 MB prompt costs
    milliseconds, where a character loop in Python took seconds on the event loop."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: str, b: str, limit: int) -> int:
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid : len(a) - lo] == b[len(b) - mid : len(b) - lo]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def diff_excerpt(old: str, new: str, width: int = 40) -> str:
    """The changed words of two texts with a little context: '…ctx [old→new]…'."""
    p = _common_prefix(old, new)
    s = _common_suffix(old, new, min(len(old), len(new)) - p)
    floor = max(0, p - width)  # widen to whole words ('10:00:07Z', not '0'), but never by more than `width`
    while p > floor and not old[p - 1].isspace():
        p -= 1
    ceiling = max(0, s - width)
    while s > ceiling and not old[len(old) - s].isspace():
        s -= 1
    context = excerpt(old[max(0, p - width // 2):p], width)
    changed_old = old[p : min(len(old) - s, p + 4 * width)]  # what `excerpt` shows, no more
    changed_new = new[p : min(len(new) - s, p + 4 * width)]
    return f"…{context} [{excerpt(changed_old, width)}→{excerpt(changed_new, width)}]…"


def held_chars(layout: Layout) -> int:
    """What a snapshot of `layout` holds, counted against HISTORY_CHARS: a pass over every block's text."""
    return sum(len(block.text) + _BLOCK_CHARS for block in layout.blocks)


@dataclass
class Scope:
    entries: dict[int, Entry] = field(default_factory=dict)
    history: deque[Snapshot] = field(default_factory=deque)  # oldest first; trimmed by its Ledger
    _writes: int = 0

    def live(self, key: int, now: float) -> Entry | None:
        entry = self.entries.get(key)
        return entry if entry is not None and entry.expires > now else None

    def sweep(self, now: float) -> None:
        self._writes += 1
        if self._writes % 1024 == 0:
            self.expire(now)

    def expire(self, now: float) -> None:
        for key in [k for k, e in self.entries.items() if e.expires <= now]:
            del self.entries[key]

    def evict(self, count: int) -> int:
        """Forget up to `count` entries, the first written first; how many went. A fan-out sibling waiting
        on one stops waiting."""
        gone = 0
        while gone < count and self.entries:
            entry = self.entries.pop(next(iter(self.entries)))
            if entry.ready is not None:
                entry.ready.set()
            gone += 1
        return gone


def spread(count: int, most: int = WRITES_PER_REQUEST) -> list[int]:
    """Indices of at most `most` of `count` items: every one when there are no more; else the first and last
    third of `most`, and the rest spread evenly between."""
    if count <= most:
        return list(range(count))
    end = most // 3
    middle, between = count - 2 * end, most - 2 * end
    return [*range(end), *(end + k * middle // between for k in range(between)), *range(count - end, count)]


class Ledger:
    """One team's view of its provider caches."""

    MAX_SCOPES = 256
    # Entries the team's scopes hold together: each is kept for the provider's TTL (5 minutes, an hour) and a
    # team could write them as fast as it sends distinct prompts, in the process every team shares. Past it,
    # the expired go, then the first written of the least recently used scopes, to three quarters.
    MAX_ENTRIES = 1 << 16

    def __init__(self) -> None:
        self.scopes: dict[tuple[str, str, str], Scope] = {}
        self.history_chars = 0  # what every scope's history holds (Snapshot.chars)
        # Every snapshot remembered, oldest first, with its scope: the history is trimmed from here. One a
        # scope has let go already (past HISTORY_PER_SCOPE, or its scope dropped) is skipped when reached.
        self._remembered: deque[tuple[Scope, Snapshot]] = deque()

    def scope(self, protocol: str, model: str, cache_key: str = "") -> Scope:
        """The scope, made if new; past MAX_SCOPES the least recently used goes (the first made went, however
        busy: a team's many OpenAI cache keys dropped its Claude scope, and the prefixes its conversations had
        written with it, again and again)."""
        key = (protocol, model, cache_key)
        found = self.scopes.pop(key, None)
        if found is not None:
            self.scopes[key] = found  # the most recently used last
        else:
            if len(self.scopes) >= self.MAX_SCOPES:
                dropped = self.scopes.pop(next(iter(self.scopes)))
                self.history_chars -= sum(snapshot.chars for snapshot in dropped.history)
                dropped.history.clear()
            found = self.scopes[key] = Scope()
        return found

    # --- prediction ------------------------------------------------------------------------
    @staticmethod
    def predict_anthropic(scope: Scope, layout: Layout, marks: list[int], now: float, ratio: float) -> Prediction:
        prediction = Prediction()
        for mark in reversed(marks):
            for b in range(mark, max(-1, mark - LOOKBACK), -1):
                entry = scope.live(layout.chain[b], now)
                if entry is None:
                    continue
                if entry.readable:
                    prediction.hit, prediction.read = b, round(layout.pos[b] * ratio)
                    break
                if prediction.pending is None:
                    prediction.pending = entry
            if prediction.hit >= 0:
                break
        return prediction

    @staticmethod
    def predict_openai(scope: Scope, layout: Layout, now: float, ratio: float) -> Prediction:
        prediction = Prediction()
        for b in range(len(layout.blocks) - 1, -1, -1):
            tokens = layout.pos[b] * ratio
            if tokens < OPENAI_MIN:
                break
            entry = scope.live(layout.chain[b], now)
            if entry is None:
                continue
            if entry.readable:
                prediction.hit, prediction.read = b, int(tokens) // OPENAI_STEP * OPENAI_STEP
                break
            if prediction.pending is None:
                prediction.pending = entry
        return prediction

    # --- writes ----------------------------------------------------------------------------
    def begin(self, scope: Scope, layout: Layout, marks: list[tuple[int, float]], hit: int, start: float,
              ratio: float, with_event: bool) -> list[Write]:
        """Record the entries this request writes or refreshes: (block, ttl seconds) per mark, at most
        WRITES_PER_REQUEST of them (`spread`)."""
        writes: list[Write] = []
        if len(marks) > WRITES_PER_REQUEST:
            marks = [marks[k] for k in spread(len(marks))]
        if hit >= 0 and (entry := scope.live(layout.chain[hit], start)) is not None:
            entry.expires = max(entry.expires, start + entry.ttl)  # a hit refreshes the TTL (A.9)
        for index, ttl in marks:
            key = layout.chain[index]
            entry = scope.live(key, start)
            if entry is not None:
                entry.ttl = max(entry.ttl, ttl)
                entry.expires = max(entry.expires, start + entry.ttl)
                writes.append(Write(key, entry, False))
                continue
            entry = Entry(round(layout.pos[index] * ratio), ttl, start + ttl, False, asyncio.Event() if with_event else None)
            scope.entries[key] = entry
            writes.append(Write(key, entry, True))
        scope.sweep(start)
        self.bound(start)
        return writes

    def bound(self, now: float) -> None:
        """At most MAX_ENTRIES entries in the team's scopes together (a shared ledger's too, read in before)."""
        held = sum(len(scope.entries) for scope in self.scopes.values())
        if held <= self.MAX_ENTRIES:
            return
        for scope in self.scopes.values():
            scope.expire(now)
        held = sum(len(scope.entries) for scope in self.scopes.values())
        for scope in self.scopes.values():  # the least recently used first
            if held <= self.MAX_ENTRIES * 3 // 4:
                break
            held -= scope.evict(held - self.MAX_ENTRIES * 3 // 4)

    @staticmethod
    def publish(writes: list[Write]) -> None:
        """The writer's response started: its entries are readable now."""
        for write in writes:
            write.entry.readable = True
            if write.entry.ready is not None:
                write.entry.ready.set()

    @staticmethod
    def discard(scope: Scope, writes: list[Write]) -> None:
        """The request failed, or the provider cached nothing: forget what it would have written."""
        for write in writes:
            if write.created and scope.entries.get(write.key) is write.entry:
                del scope.entries[write.key]
            if write.entry.ready is not None:
                write.entry.ready.set()

    # --- history and causes ----------------------------------------------------------------
    def remember(self, scope: Scope, layout: Layout, reach: int, reach_pos: int, conversation: int, now: float = 0.0,
                 chars: int | None = None) -> None:
        """Keep the request's chain for later diagnoses: the newest HISTORY_PER_SCOPE of its scope, and
        the team's newest within HISTORY_CHARS (one larger than that alone is not kept), for HISTORY_TTL_S
        from `now`, its start. `chars`: `held_chars(layout)`, if counted already (off the loop, for a large request)."""
        if chars is None:
            chars = held_chars(layout)
        snapshot = Snapshot(layout.chain, layout.blocks, reach, reach_pos, conversation, chars, now)
        scope.history.append(snapshot)
        self._remembered.append((scope, snapshot))
        self.history_chars += chars
        if len(scope.history) > HISTORY_PER_SCOPE:
            self.history_chars -= scope.history.popleft().chars
        self._trim(now)

    def sweep(self, now: float) -> None:
        """Let go of what has outlived every provider cache: requests older than HISTORY_TTL_S, expired
        entries, and scopes left holding neither (a team that stopped sending held its last hour for good)."""
        self._trim(now)
        # A scope a request has planned on but not yet written to is empty too: dropped, that one request's
        # entries and history go unremembered (a prediction only, at most once a sweep).
        for key in list(self.scopes):
            scope = self.scopes[key]
            scope.expire(now)
            if not scope.entries and not scope.history:
                del self.scopes[key]

    def _trim(self, now: float) -> None:
        most = self.MAX_SCOPES * HISTORY_PER_SCOPE  # a bound on the snapshots kept, so on those let go here too
        while self._remembered and (self.history_chars > HISTORY_CHARS or len(self._remembered) > most
                                    or self._remembered[0][1].at < now - HISTORY_TTL_S):
            owner, oldest = self._remembered.popleft()
            if owner.history and owner.history[0] is oldest:  # still kept: its scope's oldest
                owner.history.popleft()
                self.history_chars -= oldest.chars

    @staticmethod
    def diagnose(scope: Scope, layout: Layout, conversation: int, ratio: float) -> Cause | None:
        """Why this request cannot read what the most similar earlier request cached, if it cannot."""
        best: Snapshot | None = None
        best_len = -1
        for snap in reversed(scope.history):
            if snap.reach < 0:
                continue
            shared = layout.common_prefix(snap.chain)
            if shared > best_len:
                best, best_len = snap, shared
                if shared == len(layout.chain):
                    break  # no snapshot can share more: the most recent full match is the answer
        if best is None or best_len > best.reach:
            return None  # the earlier prefix is intact (an extension of it)
        before = round(layout.pos[best_len - 1] * ratio) if best_len > 0 else 0
        lost = best.reach_pos - before
        old = best.blocks[best_len]
        if best_len >= len(layout.blocks):
            return Cause("messages_changed", old.path, "history truncated", lost)
        new = layout.blocks[best_len]
        if new.section == "messages" and best.conversation != conversation:
            return None  # another conversation: nothing was shared past the common part
        return Cause(f"{new.section}_changed", new.path, diff_excerpt(old.text, new.text), lost)
