"""Paged KV cache bookkeeping: fixed-size blocks, ref counts, prefix caching, LRU eviction.

Design follows vLLM v1's KV cache manager:
- Free blocks live in an intrusive doubly linked list, so taking a cached block back out of the
  free list (a prefix hit on a block nobody holds) is O(1), as are allocation and freeing.
- Only full blocks are cached, keyed by a hash chain H(parent, tokens, extra) so a hit on block i
  implies hits on blocks 0..i-1. The per-tenant `cache_salt` enters the first block's key, hence
  every key after it: tenants never share blocks, so one cannot time another's prefixes.
- Freed blocks keep their hash (lazy eviction): they stay hittable until the allocator reuses them.
  Sequences free their blocks in reverse, so a chain's tail is evicted before its head.
- The allocator reuses a free block without a cached prefix first (least recently freed first);
  else the least recently used free block of the tenant (`cache_salt` up to ':') holding the most
  cached free blocks, so one tenant's flood of distinct prompts evicts its own prefixes before
  another's (with one tenant: LRU). Free blocks are also linked per tenant (None: no prefix).
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass

from localengine.engine.sequence import Sequence, tenant


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None
    tenant: str | None = None  # whose prefix `block_hash` is (None: no hash)
    prev_free: KVCacheBlock | None = None
    next_free: KVCacheBlock | None = None
    prev_kept: KVCacheBlock | None = None  # in its tenant's list of free blocks
    next_kept: KVCacheBlock | None = None


class _Kept:
    """One tenant's free blocks, least recently freed first (linked through prev/next_kept)."""

    def __init__(self) -> None:
        self.head, self.tail = KVCacheBlock(-1), KVCacheBlock(-1)
        self.head.next_kept, self.tail.prev_kept = self.tail, self.head
        self.count = 0

    def append(self, block: KVCacheBlock) -> None:
        last = self.tail.prev_kept
        assert last is not None
        last.next_kept, block.prev_kept = block, last
        block.next_kept, self.tail.prev_kept = self.tail, block
        self.count += 1

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_kept, block.next_kept
        assert prev is not None and nxt is not None
        prev.next_kept, nxt.prev_kept = nxt, prev
        block.prev_kept = block.next_kept = None
        self.count -= 1


class FreeKVCacheBlockQueue:
    """Doubly linked free list with sentinels: LRU at the head, most recently freed at the tail; and
    per tenant (None: no cached prefix), its free blocks in the same order."""

    def __init__(self, blocks: list[KVCacheBlock]):
        self.head = KVCacheBlock(-1)
        self.tail = KVCacheBlock(-1)
        self.head.next_free, self.tail.prev_free = self.tail, self.head
        self.num_free_blocks = 0
        self.kept: dict[str | None, _Kept] = {}
        # Tenants by how many free cached blocks they hold, and the most any holds: the tenant to take a
        # block from is found in O(1) however many tenants there are (counts move by one).
        self._holding: dict[int, dict[str, None]] = {}
        self._most = 0
        for block in blocks:
            self.append(block)

    def append(self, block: KVCacheBlock) -> None:
        last = self.tail.prev_free
        assert last is not None
        last.next_free, block.prev_free = block, last
        block.next_free, self.tail.prev_free = self.tail, block
        self.num_free_blocks += 1
        self._keep(block)

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        assert prev is not None and nxt is not None, f"block {block.block_id} is not free"
        prev.next_free, nxt.prev_free = nxt, prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1
        self._forget(block)

    def uncache(self, block: KVCacheBlock) -> None:
        """A free block's prefix is dropped: it moves to the blocks without one."""
        self._forget(block)
        block.block_hash = block.tenant = None
        self._keep(block)

    def _keep(self, block: KVCacheBlock) -> None:
        kept = self.kept.get(block.tenant) or self.kept.setdefault(block.tenant, _Kept())
        kept.append(block)
        if block.tenant is not None:
            self._move(block.tenant, kept.count - 1, kept.count)

    def _forget(self, block: KVCacheBlock) -> None:
        kept = self.kept[block.tenant]
        kept.remove(block)
        if block.tenant is not None:
            self._move(block.tenant, kept.count + 1, kept.count)
        if not kept.count:
            del self.kept[block.tenant]

    def _move(self, tenant: str, before: int, after: int) -> None:
        if before:
            holding = self._holding[before]
            del holding[tenant]
            if not holding:
                del self._holding[before]
                if self._most == before:
                    self._most = after
        if after:
            self._holding.setdefault(after, {})[tenant] = None
            self._most = max(self._most, after)

    def popleft(self) -> KVCacheBlock:
        """The block to reuse: the least recently freed without a cached prefix, else the least recently
        used of the tenant holding the most free cached blocks."""
        if not self.num_free_blocks:
            raise RuntimeError("no free KV cache blocks")
        kept = self.kept.get(None) or self.kept[next(iter(self._holding[self._most]))]
        block = kept.head.next_kept
        assert block is not None
        self.remove(block)
        return block

    def block_ids(self) -> list[int]:
        ids, node = [], self.head.next_free
        while node is not None and node is not self.tail:
            ids.append(node.block_id)
            node = node.next_free
        return ids


def hash_block(parent: bytes | None, token_ids: list[int], extra: str | None) -> bytes:
    # blake2b, not Python's hash(): keys must not collide across tenants (vLLM advises sha256
    # for multi-tenant caches); 16 bytes keep dict lookups cheap.
    h = hashlib.blake2b(parent or b"root", digest_size=16)
    h.update(array("q", token_ids).tobytes())
    if extra is not None:
        h.update(b"\x00salt\x00" + extra.encode())
    return h.digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached: dict[bytes, KVCacheBlock] = {}
        # Prefix-cache counters in tokens, vLLM's meaning of queries and hits.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free_blocks

    def usage(self) -> float:
        """Fraction of blocks held by requests (free-but-cached blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def _block_hashes(self, seq: Sequence, num_full_blocks: int) -> list[bytes]:
        bs = self.block_size
        while len(seq.block_hashes) < num_full_blocks:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if i else None
            extra = seq.cache_salt if i == 0 else None
            seq.block_hashes.append(hash_block(parent, seq.token_ids[i * bs : (i + 1) * bs], extra))
        return seq.block_hashes[:num_full_blocks]

    def get_computed_blocks(self, seq: Sequence) -> tuple[list[KVCacheBlock], int]:
        """Longest cached prefix of a sequence that holds no blocks yet, in blocks and tokens."""
        assert not seq.block_table, "only sequences without blocks look up the prefix cache"
        if not self.enable_prefix_caching:
            return [], 0
        # At least the last token is recomputed: its logits are needed to sample the next one.
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        for block_hash in self._block_hashes(seq, max_blocks):
            block = self.cached.get(block_hash)
            if block is None:
                break  # the chain makes every later block a miss too
            hits.append(block)
        return hits, len(hits) * self.block_size

    def allocate_slots(
        self,
        seq: Sequence,
        num_new_tokens: int,
        computed_blocks: list[KVCacheBlock] | None = None,
        num_lookahead_tokens: int = 0,
    ) -> bool:
        """Give `seq` room for `num_new_tokens` more tokens (plus lookahead slots for speculative
        tokens); on admission `computed_blocks` are the prefix-cache hits. False if it doesn't fit."""
        admission = computed_blocks is not None
        computed_blocks = computed_blocks or []
        num_computed = seq.num_computed_tokens + len(computed_blocks) * self.block_size
        needed_total = -(-(num_computed + num_new_tokens + num_lookahead_tokens) // self.block_size)
        num_new_blocks = max(0, needed_total - len(seq.block_table) - len(computed_blocks))
        # Hit blocks nobody holds sit in the free queue: taking them costs free blocks too.
        num_revived = sum(1 for b in computed_blocks if b.ref_cnt == 0)
        if num_new_blocks + num_revived > self.num_free_blocks:
            return False
        for block in computed_blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1
            seq.block_table.append(block.block_id)
        for _ in range(num_new_blocks):
            block = self.free_queue.popleft()
            self._evict(block)
            block.ref_cnt = 1
            seq.block_table.append(block.block_id)
        seq.num_computed_tokens = num_computed
        if admission:  # counted once per admission, not per attempt of a request left waiting for room
            self.prefix_cache_queries += seq.num_tokens
            self.prefix_cache_hits += len(computed_blocks) * self.block_size
        return True

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
            block.block_hash = block.tenant = None

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the blocks of `seq` whose K/V are now complete, so later requests can hit them."""
        if not self.enable_prefix_caching:
            return
        # Accepted speculative tokens are computed before they are appended to token_ids: a block
        # is hashed only once its tokens are known, i.e. at the next step.
        num_full = min(seq.num_computed_tokens, seq.num_tokens) // self.block_size
        num_full = min(num_full, len(seq.block_table))
        done = seq.num_registered_blocks
        if num_full <= done:
            return  # most steps: no block filled up (this used to walk every full block, every step)
        hashes = self._block_hashes(seq, num_full)
        for i in range(done, num_full):
            block = self.blocks[seq.block_table[i]]
            if block.block_hash is None and hashes[i] not in self.cached:
                block.block_hash, block.tenant = hashes[i], tenant(seq)
                self.cached[hashes[i]] = block
            # else: already cached, or an identical block exists elsewhere (block tables are
            # append-only, so the duplicate stays private and is freed normally).
        seq.num_registered_blocks = num_full

    def free(self, seq: Sequence) -> None:
        # Reverse order: the tail of a chain reaches the free list first and is evicted first.
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"block {block_id} freed twice"
            if block.ref_cnt == 0:
                self.free_queue.append(block)
        seq.block_table = []
        seq.num_registered_blocks = 0
        seq.num_computed_tokens = 0

    def reset_prefix_cache(self) -> None:
        for block in self.cached.values():
            if block.ref_cnt == 0:
                self.free_queue.uncache(block)
            else:
                block.block_hash = block.tenant = None
        self.cached.clear()
