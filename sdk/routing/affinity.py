"""Prefix affinity: requests that share a leading block of prompt go to the same replica.

A replica's prefix cache only pays when the requests that share a prefix reach it (SGLang's
cache-aware router, vLLM's production stack and llm-d route by prefix for this reason). The
prompt (tools, system, instructions, messages or input, serialized in order, so a conversation
that grows by appending keeps its earlier bytes) is cut into blocks of `BLOCK_BYTES` and hashed as
a chain: block i's hash covers blocks 0..i, so equal hashes mean equal prefixes.

Per request, over the route's targets:
1. the longest prefix this router has seen answered: the target that answered the deepest block
   hash the request shares (a hashed radix tree, remembered in a bounded LRU);
2. otherwise the target that holds the fewest prefixes, ties broken by rendezvous hashing on the
   first block (plain hashing lands a handful of prefixes on three replicas 6/3/0 as often as
   not, and even the power of two choices leaves 4/3/2: the cache of the replica with the most
   thrashes once its prefixes outgrow it; SGLang's router sends a new prefix to the replica with
   the smallest cache tree for the same reason). Prefixes already placed never move when others
   arrive, and adding or removing a replica moves only that replica's share;
3. bounded load: a pick already running more than `LOAD_SLACK` times its fair share of the
   route's requests in flight (plus `LOAD_ALLOWANCE`) yields to the next target in rendezvous
   order, so one hot prefix cannot pile onto one replica.
The remaining targets follow in rendezvous order as fallbacks; a new prefix's root is claimed
when it is routed. The target that answers owns the request's blocks that had no live owner (a
conversation that spilled over keeps its new turns where its history now is, while the shared
system prompt stays with its owner: a spill is momentary); after a failed attempt it takes over
every block, so a failed replica hands its prefixes on.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter, OrderedDict
from collections.abc import Collection, Sequence
from typing import Any

import orjson

BLOCK_BYTES = 256  # about 64 tokens of JSON-serialized prompt
MAX_BLOCKS = 64  # deeper than 16 KB, a longer match changes nothing about where to go
# A target may run LOAD_SLACK x its fair share of the route's in-flight requests, plus
# LOAD_ALLOWANCE, before its prefixes spill over (SGLang's router is looser still: it balances only
# past a 1.5x and 64-request imbalance); a tight bound scatters prefixes at low concurrency.
LOAD_SLACK = 1.5
LOAD_ALLOWANCE = 2
_PROMPT_FIELDS = ("tools", "system", "instructions", "messages", "input", "prompt")


def prefix_hashes(body: dict[str, Any]) -> list[bytes]:
    """The chain hashes of the prompt's full blocks; a prompt shorter than a block is one block."""
    text = orjson.dumps([body.get(name) for name in _PROMPT_FIELDS if name in body])
    num_blocks = min(max(len(text) // BLOCK_BYTES, 1), MAX_BLOCKS)
    hashes: list[bytes] = []
    previous = b""
    for i in range(num_blocks):
        previous = hashlib.blake2b(previous + text[i * BLOCK_BYTES : (i + 1) * BLOCK_BYTES], digest_size=8).digest()
        hashes.append(previous)
    return hashes


class PrefixOwners:
    """Block hash -> the target key that last answered a request with that prefix (LRU-bounded),
    and how many distinct first blocks (prefix roots) each target holds."""

    def __init__(self, capacity: int = 100_000):
        self.capacity = capacity
        self._owners: OrderedDict[bytes, str] = OrderedDict()
        self._roots: set[bytes] = set()
        self.roots_held: Counter[str] = Counter()

    def deepest(self, hashes: Sequence[bytes], keys: set[str]) -> str | None:
        for h in reversed(hashes):
            owner = self._owners.get(h)
            if owner is not None and owner in keys:
                self._owners.move_to_end(h)
                return owner
        return None

    def remember(self, hashes: Sequence[bytes], key: str, keep: Collection[str] = ()) -> None:
        """`key` now holds these blocks; those owned by a target in `keep` stay with it."""
        for i, h in enumerate(hashes):
            owner = self._owners.get(h)
            if owner is not None and owner in keep:
                self._owners.move_to_end(h)
                continue
            if i == 0:
                if owner is not None:
                    self.roots_held[owner] -= 1
                self._roots.add(h)
                self.roots_held[key] += 1
            self._owners[h] = key
            self._owners.move_to_end(h)
        while len(self._owners) > self.capacity:
            h, owner = self._owners.popitem(last=False)
            if h in self._roots:
                self._roots.discard(h)
                self.roots_held[owner] -= 1


def rendezvous_order(first_block: bytes, keys: Sequence[str]) -> list[int]:
    """Indices of `keys` by descending rendezvous score for this block (highest random weight)."""
    def score(i: int) -> bytes:
        return hashlib.blake2b(first_block + keys[i].encode(), digest_size=8).digest()
    return sorted(range(len(keys)), key=score, reverse=True)


def affinity_order(keys: Sequence[str], in_flight: Sequence[int], hashes: Sequence[bytes],
                   owners: PrefixOwners) -> list[int]:
    """The order in which to try the targets named by `keys` (indices into `keys`)."""
    order = rendezvous_order(hashes[0], keys)
    owner = owners.deepest(hashes, set(keys))
    if owner is not None:
        pick = keys.index(owner)
    else:
        pick = min(order, key=lambda i: owners.roots_held[keys[i]])  # ties: rendezvous order
        # Claimed now, not when the answer comes: the requests of a burst that share this new
        # prefix follow it instead of each choosing again.
        owners.remember(hashes[:1], keys[pick])
    order.remove(pick)
    order.insert(0, pick)
    cap = math.ceil((sum(in_flight) + 1) / len(keys) * LOAD_SLACK) + LOAD_ALLOWANCE
    for position, i in enumerate(order):
        if in_flight[i] < cap:
            return [i] + order[:position] + order[position + 1 :]
    return sorted(order, key=lambda i: in_flight[i])
