"""A random paged-attention batch (scattered cache blocks, cached contexts, new query tokens) for
kernel tests: the PyTorch reference against the Triton kernels and the quantized cache paths."""

from __future__ import annotations

import torch

from localengine.kernels import reference
from localengine.layers.attention import AttentionMetadata

BLOCK = 4
KV_HEADS, HEADS, HEAD_DIM = 2, 4, 16


def build_batch(specs: list[tuple[int, int]], num_blocks: int = 40, seed: int = 0, block: int = BLOCK,
                heads: int = HEADS, kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM):
    """specs: (context already cached, new query tokens) per sequence, decodes (q=1) first."""
    g = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(num_blocks, block, kv_heads, head_dim, generator=g)
    v_cache = torch.randn(num_blocks, block, kv_heads, head_dim, generator=g)
    free = torch.randperm(num_blocks, generator=g).tolist()  # scattered, out-of-order blocks
    tables, slots, qs, ks, vs = [], [], [], [], []
    starts, seq_lens = [0], []
    for ctx, n in specs:
        seq_len = ctx + n
        table = [free.pop() for _ in range(-(-seq_len // block))]
        tables.append(table)
        k_full = torch.randn(seq_len, kv_heads, head_dim, generator=g)
        v_full = torch.randn(seq_len, kv_heads, head_dim, generator=g)
        pos = torch.arange(seq_len)
        all_slots = torch.tensor(table)[pos // block] * block + pos % block
        reference.store_kv_cache(k_full, v_full, k_cache, v_cache, all_slots)
        slots.append(all_slots[ctx:])
        ks.append(k_full[ctx:])
        vs.append(v_full[ctx:])
        qs.append(torch.randn(n, heads, head_dim, generator=g))
        starts.append(starts[-1] + n)
        seq_lens.append(seq_len)
    width = max(len(t) for t in tables)
    meta = AttentionMetadata(
        slot_mapping=torch.cat(slots),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        query_start_loc_cpu=starts,
        seq_lens_cpu=seq_lens,
        num_decodes=sum(1 for _, n in specs if n == 1),
        max_query_len=max(n for _, n in specs),
    )
    return torch.cat(qs), torch.cat(ks), torch.cat(vs), k_cache, v_cache, meta
