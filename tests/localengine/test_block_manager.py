"""Block manager and scheduler under random workloads (hypothesis), with a shadow KV cache.

The shadow cache records, for every slot, which (tenant, token prefix) the K/V written there
belongs to. If prefix sharing ever handed a request a block holding someone else's K/V, or a
shared block were overwritten, the check that every computed position of every live request
reads its own prefix would fail.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from localengine.engine.block_manager import BlockManager, FreeKVCacheBlockQueue, KVCacheBlock
from localengine.engine.scheduler import Scheduler
from localengine.engine.sequence import Sequence
from localengine.sampling_params import SamplingParams

BS = 4

op = st.one_of(
    st.tuples(st.just("add"), st.lists(st.integers(0, 2), min_size=6, max_size=30), st.sampled_from([None, "a", "b"])),
    st.tuples(st.just("step"), st.integers(1, 8)),
    st.tuples(st.just("abort"), st.integers(0, 50)),
)


def check_invariants(bm: BlockManager, sched: Scheduler, shadow: dict[int, tuple]) -> None:
    live = list(sched.requests.values())
    refs = [0] * bm.num_blocks
    for seq in live:
        assert len(set(seq.block_table)) == len(seq.block_table)
        for b in seq.block_table:
            refs[b] += 1
    assert [b.ref_cnt for b in bm.blocks] == refs
    free_ids = bm.free_queue.block_ids()
    assert len(free_ids) == bm.num_free_blocks == len(set(free_ids))
    assert set(free_ids) == {i for i, r in enumerate(refs) if r == 0}
    for key, block in bm.cached.items():
        assert block.block_hash == key
    kept: dict = {}  # the per-tenant lists partition the free blocks, each block under its prefix's tenant
    for name, blocks in bm.free_queue.kept.items():
        node = blocks.head.next_kept
        while node is not blocks.tail:
            assert node.tenant == name and (name is None) == (node.block_hash is None)
            kept[node.block_id] = name
            node = node.next_kept
        assert blocks.count == sum(1 for owner in kept.values() if owner == name)
    assert sorted(kept) == sorted(free_ids)
    counts = [blocks.count for name, blocks in bm.free_queue.kept.items() if name is not None]
    assert bm.free_queue._most == max(counts, default=0)
    for seq in live:
        assert len(seq.block_table) * BS >= seq.num_computed_tokens
        for pos in range(seq.num_computed_tokens):
            slot = seq.block_table[pos // BS] * BS + pos % BS
            assert shadow[slot] == (seq.cache_salt, tuple(seq.token_ids[: pos + 1])), "wrong K/V shared"


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(op, min_size=12, max_size=40), num_blocks=st.integers(10, 20), caching=st.booleans())
def test_random_workload_keeps_block_accounting_exact(ops, num_blocks, caching):
    bm = BlockManager(num_blocks, BS, enable_prefix_caching=caching)
    sched = Scheduler(bm, max_num_batched_tokens=12, max_num_seqs=6, max_model_len=num_blocks * BS)
    shadow: dict[int, tuple] = {}
    n = 0
    for kind, *args in ops:
        if kind == "add":
            tokens, salt = args
            if len(tokens) + 8 > num_blocks * BS:
                continue
            # A tiny alphabet makes shared prefixes (and prefix-cache hits) common.
            sched.add(Sequence(f"r{n}", tokens, SamplingParams(max_tokens=8), cache_salt=salt))
            n += 1
        elif kind == "abort":
            ids = sorted(sched.requests)
            if ids:
                sched.finish(sched.requests[ids[args[0] % len(ids)]], "abort")
        else:
            for _ in range(args[0]):
                out = sched.schedule()
                for item in out.scheduled:
                    seq = item.seq
                    for pos in range(item.num_computed_before, item.num_computed_before + item.num_new_tokens):
                        slot = seq.block_table[pos // BS] * BS + pos % BS
                        shadow[slot] = (seq.cache_salt, tuple(seq.token_ids[: pos + 1]))
                sched.update_after_step(out)
                for item in out.scheduled:
                    if item.samples:
                        item.seq.append_token(item.seq.num_tokens % 3)
                        if item.seq.num_output_tokens >= 8:
                            sched.finish(item.seq, "length")
        check_invariants(bm, sched, shadow)
    for seq in list(sched.requests.values()):
        sched.finish(seq, "abort")
    assert bm.num_free_blocks == num_blocks
    assert all(b.ref_cnt == 0 for b in bm.blocks)


def test_free_queue_is_lru_and_o1_remove():
    blocks = [KVCacheBlock(i) for i in range(4)]
    q = FreeKVCacheBlockQueue(blocks)
    q.remove(blocks[2])
    assert q.block_ids() == [0, 1, 3]
    q.append(blocks[2])
    assert q.popleft() is blocks[0]
    assert q.block_ids() == [1, 3, 2]


def test_freed_chain_tail_is_evicted_first_and_hits_survive():
    bm = BlockManager(4, BS)
    seq = Sequence("a", list(range(13)), SamplingParams())
    assert bm.allocate_slots(seq, 13)
    seq.num_computed_tokens = 13
    bm.cache_full_blocks(seq)
    assert len(bm.cached) == 3
    bm.free(seq)
    # Reverse-order free: the partial last block, then the chain's tail, reach the queue first.
    assert bm.free_queue.block_ids() == [3, 2, 1, 0]
    again = Sequence("b", list(range(13)), SamplingParams())
    hits, n = bm.get_computed_blocks(again)
    assert n == 12 and [b.block_id for b in hits] == [0, 1, 2]
