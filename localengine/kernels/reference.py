"""PyTorch reference for the paged-attention kernels; the CPU execution path.

Decode sequences are batched into one SDPA call over K/V gathered through their block tables
(padded to the longest context, masked). Prefill chunks run one SDPA call per sequence; a chunk
with no cached prefix attends to its own fresh K/V with a plain causal mask and skips the gather.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from localengine.layers.attention import AttentionMetadata


def store_kv_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """k, v: [tokens, kv_heads, head_dim]; caches: [blocks, block_size, kv_heads, head_dim]."""
    k_cache.view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v)


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """[seqs, num_blocks * block_size, kv_heads, head_dim]: each sequence's context, in order."""
    gathered = cache[block_tables[:, :num_blocks].long()]
    return gathered.flatten(1, 2)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q: [tokens, heads, head_dim], k/v: this step's [tokens, kv_heads, head_dim] (already stored)."""
    out = torch.empty_like(q)
    block_size = k_cache.shape[1]
    nd = meta.num_decodes
    if nd:
        seq_lens = meta.seq_lens[:nd]
        max_len = max(meta.seq_lens_cpu[:nd])
        nb = -(-max_len // block_size)
        keys = gather_kv(k_cache, meta.block_tables[:nd], nb).transpose(1, 2)
        values = gather_kv(v_cache, meta.block_tables[:nd], nb).transpose(1, 2)
        mask = torch.arange(nb * block_size, device=q.device)[None, :] < seq_lens[:, None]
        out[:nd] = F.scaled_dot_product_attention(
            q[:nd].unsqueeze(2), keys, values, attn_mask=mask[:, None, None, :], scale=scale, enable_gqa=True
        ).squeeze(2)
    starts = meta.query_start_loc_cpu
    for i in range(nd, len(meta.seq_lens_cpu)):
        s, e, seq_len = starts[i], starts[i + 1], meta.seq_lens_cpu[i]
        qi = q[s:e].transpose(0, 1)
        if seq_len == e - s:  # no cached prefix: everything this sequence sees was computed now
            ki, vi = k[s:e].transpose(0, 1), v[s:e].transpose(0, 1)
            oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale, enable_gqa=True)
        else:
            nb = -(-seq_len // block_size)
            ki = gather_kv(k_cache, meta.block_tables[i : i + 1], nb)[0, :seq_len].transpose(0, 1)
            vi = gather_kv(v_cache, meta.block_tables[i : i + 1], nb)[0, :seq_len].transpose(0, 1)
            q_pos = torch.arange(seq_len - (e - s), seq_len, device=q.device)
            mask = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None]
            oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=scale, enable_gqa=True)
        out[s:e] = oi.transpose(0, 1)
    return out
