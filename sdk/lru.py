"""A map bounded by its number of entries, the least recently used dropped first.

The per-team memories (compressed pieces, conversation summaries, a conversation's last system
prompt) hold keys that come from clients, so each must stay bounded; this is the one bounded map
they share. It is not thread-safe: a caller used from worker threads holds its own lock.

Two bounded maps keep their own OrderedDict for what this one leaves out: the embedding cache
(sdk/cache/embeddings.py) bounds bytes as well as entries, under limits each call passes, and
expires entries; prefix affinity (sdk/routing/affinity.py) refreshes an entry only when its owner is
still a candidate, and keeps a count of prefix roots per owner that eviction must update.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The value, now the most recently used; None when absent."""
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        """Store as the most recently used, dropping the least recently used past `max_entries`."""
        self._entries[key] = value
        self._entries.move_to_end(key)
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def pop(self, key: K) -> V | None:
        return self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries
