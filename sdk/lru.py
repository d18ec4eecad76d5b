"""A map bounded by its number of entries (and, where asked, by what its values hold), the least
recently used dropped first.

The per-team memories (compressed pieces, conversation summaries, a conversation's last system
prompt) hold keys that come from clients, so each must stay bounded; this is the one bounded map
they share. It is not thread-safe: a caller used from worker threads holds its own lock.

`TeamMemo` is the other shape: one memo that every team's requests share (token counts by digest),
bounded in all, each team's entries in a map of its own.

Two bounded maps keep their own OrderedDict for what this one leaves out: the embedding cache
(sdk/cache/embeddings.py) bounds bytes as well as entries, under limits each call passes, and
expires entries; prefix affinity (sdk/routing/affinity.py) refreshes an entry only when its owner is
still a candidate, and keeps a count of prefix roots per owner that eviction must update.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """`max_entries` at most; with `cost` (what a value holds, in characters say) also at most `max_cost`
    of it in all, and a value costing more than that alone is not kept."""

    def __init__(self, max_entries: int, max_cost: int | None = None, cost: Callable[[V], int] | None = None) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self.max_cost = max_cost if cost is not None else None
        self._cost = cost
        self.held = 0  # the values' cost in all
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._costs: dict[K, int] = {}

    def get(self, key: K) -> V | None:
        """The value, now the most recently used; None when absent."""
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        """Store as the most recently used, dropping the least recently used past `max_entries` (and `max_cost`)."""
        self.pop(key)
        cost = self._cost(value) if self._cost is not None else 0
        if self.max_cost is not None and cost > self.max_cost:
            return
        self._entries[key] = value
        if cost:
            self._costs[key] = cost
            self.held += cost
        while len(self._entries) > self.max_entries or (self.max_cost is not None and self.held > self.max_cost):
            oldest, _ = self._entries.popitem(last=False)
            self.held -= self._costs.pop(oldest, 0)

    def pop(self, key: K) -> V | None:
        self.held -= self._costs.pop(key, 0)
        return self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries


class TeamMemo(Generic[K, V]):
    """Values by (team, key), at most `bound` in all. When it is full, the team holding the most
    entries loses its own: a team's flood of new keys clears its own memo. One map cleared wholesale
    when full let one team's flood clear every team's memo, so the others' next requests counted
    again what they had counted (on the event loop) or estimated it. Safe across threads."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._teams: dict[str, dict[K, V]] = {}
        self._size = 0
        self._lock = threading.Lock()

    def get(self, team: str, key: K) -> V | None:
        memo = self._teams.get(team)
        return memo.get(key) if memo is not None else None

    def put(self, team: str, key: K, value: V) -> None:
        with self._lock:
            memo = self._teams.setdefault(team, {})
            if key not in memo:
                if self._size >= self.bound:
                    fullest = self._teams[max(self._teams, key=lambda t: len(self._teams[t]))]
                    self._size -= len(fullest)
                    fullest.clear()
                self._size += 1
            memo[key] = value

    def __contains__(self, item: object) -> bool:
        """`(team, key) in memo`."""
        if not isinstance(item, tuple) or len(item) != 2:
            return False
        memo = self._teams.get(item[0])
        return memo is not None and item[1] in memo

    def __iter__(self) -> Iterator[tuple[str, K]]:
        """Every (team, key) held."""
        return iter([(team, key) for team, memo in self._teams.items() for key in list(memo)])

    def __len__(self) -> int:
        return self._size
