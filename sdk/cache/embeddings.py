"""The exact embedding cache: one vector per (team, model, input item, dimensions, encoding).

Embeddings are deterministic, so serving a stored vector never changes an answer: the cache is
always safe. Entries hold the provider's own JSON value for the item's `embedding` (a float list or
a base64 string) so a hit is the bytes the provider sent. In memory, per process, least recently
used first out within each team's entry and byte bounds; partitions are keyed by team first, so no
lookup can reach another team's vectors.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class StoredVector:
    embedding: bytes  # the provider's JSON for this item's `embedding`
    model: str  # the `model` the provider's answer named
    route: str  # PROVIDER/MODEL that computed it
    expires_at: float


@dataclass(frozen=True, slots=True)
class EmbeddingCacheLimits:
    ttl_s: float
    max_entries: int
    max_bytes: int


def item_key(model: str, item: str | list[int], dimensions: Any, encoding: str) -> bytes:
    """What decides a vector: the model, the one input item, and the output's shape and encoding."""
    return hashlib.sha256(orjson.dumps([model, item, dimensions, encoding])).digest()


@dataclass
class _Partition:
    entries: OrderedDict[bytes, StoredVector] = field(default_factory=OrderedDict)
    size: int = 0


class EmbeddingCache:
    def __init__(self) -> None:
        self._teams: dict[str, _Partition] = {}
        self._lock = threading.Lock()  # the SDK may call from more than one event loop

    def get_many(self, team: str, keys: list[bytes]) -> list[StoredVector | None]:
        now = time.time()
        found: list[StoredVector | None] = []
        with self._lock:
            partition = self._teams.get(team)
            if partition is None:
                return [None] * len(keys)
            for key in keys:
                entry = partition.entries.get(key)
                if entry is not None and entry.expires_at <= now:
                    partition.size -= len(partition.entries.pop(key).embedding)
                    entry = None
                if entry is not None:
                    partition.entries.move_to_end(key)
                found.append(entry)
        return found

    def put_many(self, team: str, items: list[tuple[bytes, bytes]], model: str, route: str, limits: EmbeddingCacheLimits) -> None:
        expires_at = time.time() + limits.ttl_s
        with self._lock:
            partition = self._teams.setdefault(team, _Partition())
            for key, embedding in items:
                if len(embedding) > limits.max_bytes:
                    continue
                old = partition.entries.pop(key, None)
                if old is not None:
                    partition.size -= len(old.embedding)
                partition.entries[key] = StoredVector(embedding, model, route, expires_at)
                partition.size += len(embedding)
            while partition.entries and (len(partition.entries) > limits.max_entries or partition.size > limits.max_bytes):
                _, evicted = partition.entries.popitem(last=False)
                partition.size -= len(evicted.embedding)

    def invalidate_team(self, team: str) -> int:
        with self._lock:
            partition = self._teams.pop(team, None)
        return len(partition.entries) if partition is not None else 0
