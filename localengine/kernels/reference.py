"""PyTorch reference for the paged-attention kernels; the CPU execution path.

Decode sequences are batched into one SDPA call over K/V gathered through their block tables
(padded to the longest context, masked). Short queries over a cached prefix (speculative
verification: the last token plus k proposals) are batched the same way, grouped by query length.
Other prefill chunks run one SDPA call per sequence; a chunk with no cached prefix attends to its
own fresh K/V with a plain causal mask and skips the gather.

Gathers write into a `GatherWorkspace` reused by every layer and step: on CPU, allocating a fresh
tens-of-MB tensor per layer costs more in page faults than the copy itself (measured 5x).
"""

from __future__ import annotations

import math
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


DECODE_GROUP = 16  # decode sequences per SDPA call
# Longest query batched like a decode; per-sequence SDPA calls made verification steps of 8
# requests ~5x slower than plain decode steps on CPU.
MAX_GROUPED_QUERY_LEN = 33


class GatherWorkspace:
    """Two growable buffers (K and V) for gathered context; one per model runner (engine thread)."""

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, like: torch.Tensor, num_blocks: int) -> torch.Tensor:
        shape = (num_blocks, *like.shape[1:])
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < math.prod(shape) or buf.dtype != like.dtype or buf.device != like.device:
            buf = self.buffers[name] = torch.empty(math.prod(shape) * 5 // 4, dtype=like.dtype, device=like.device)
        return buf[: math.prod(shape)].view(shape)


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, num_blocks: int,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """[seqs, num_blocks * block_size, kv_heads, head_dim]: each sequence's context, in order."""
    ids = block_tables[:, :num_blocks].reshape(-1).long()
    gathered = torch.index_select(cache, 0, ids, out=out) if out is not None else cache.index_select(0, ids)
    return gathered.view(block_tables.shape[0], num_blocks * cache.shape[1], *cache.shape[2:])


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                    workspace: GatherWorkspace | None = None) -> torch.Tensor:
    """q: [tokens, heads, head_dim], k/v: this step's [tokens, kv_heads, head_dim] (already stored)."""
    ws = workspace or GatherWorkspace()
    out = torch.empty_like(q)
    block_size = k_cache.shape[1]
    # Decodes are padded to the longest context in their group; the model runner sorts them by
    # length, so groups of similar lengths waste little on padding.
    for g in range(0, meta.num_decodes, DECODE_GROUP):
        rows = slice(g, min(g + DECODE_GROUP, meta.num_decodes))
        n = rows.stop - rows.start
        nb = -(-max(meta.seq_lens_cpu[rows]) // block_size)
        keys = gather_kv(k_cache, meta.block_tables[rows], nb, ws.get("k", k_cache, n * nb)).transpose(1, 2)
        values = gather_kv(v_cache, meta.block_tables[rows], nb, ws.get("v", v_cache, n * nb)).transpose(1, 2)
        mask = torch.arange(nb * block_size, device=q.device)[None, :] < meta.seq_lens[rows, None]
        out[rows] = F.scaled_dot_product_attention(
            q[rows].unsqueeze(2), keys, values, attn_mask=mask[:, None, None, :], scale=scale, enable_gqa=True
        ).squeeze(2)
    starts = meta.query_start_loc_cpu
    by_len: dict[int, list[int]] = {}
    rest = []
    for i in range(meta.num_decodes, len(meta.seq_lens_cpu)):
        n = starts[i + 1] - starts[i]
        if n <= MAX_GROUPED_QUERY_LEN and meta.seq_lens_cpu[i] > n:
            by_len.setdefault(n, []).append(i)
        else:
            rest.append(i)
    for n, seqs in by_len.items():
        for g in range(0, len(seqs), DECODE_GROUP):
            group = seqs[g : g + DECODE_GROUP]
            _short_queries(q, out, k_cache, v_cache, meta, scale, ws, group, n)
    for i in rest:
        s, e, seq_len = starts[i], starts[i + 1], meta.seq_lens_cpu[i]
        qi = q[s:e].transpose(0, 1)
        if seq_len == e - s:  # no cached prefix: everything this sequence sees was computed now
            ki, vi = k[s:e].transpose(0, 1), v[s:e].transpose(0, 1)
            oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale, enable_gqa=True)
        else:
            nb = -(-seq_len // block_size)
            ki = gather_kv(k_cache, meta.block_tables[i : i + 1], nb, ws.get("k", k_cache, nb))[0, :seq_len]
            vi = gather_kv(v_cache, meta.block_tables[i : i + 1], nb, ws.get("v", v_cache, nb))[0, :seq_len]
            ki, vi = ki.transpose(0, 1), vi.transpose(0, 1)
            q_pos = torch.arange(seq_len - (e - s), seq_len, device=q.device)
            mask = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None]
            oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=scale, enable_gqa=True)
        out[s:e] = oi.transpose(0, 1)
    return out


def _short_queries(q: torch.Tensor, out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   meta: AttentionMetadata, scale: float, ws: GatherWorkspace, group: list[int], n: int) -> None:
    """One SDPA call for sequences that each add n query tokens after a cached prefix."""
    block_size = k_cache.shape[1]
    starts = meta.query_start_loc_cpu
    rows = torch.cat([torch.arange(starts[i], starts[i] + n) for i in group]).to(q.device)
    idx = torch.tensor(group, device=q.device)
    seq_lens = meta.seq_lens[idx]
    nb = -(-max(meta.seq_lens_cpu[i] for i in group) // block_size)
    tables = meta.block_tables[idx]
    keys = gather_kv(k_cache, tables, nb, ws.get("k", k_cache, len(group) * nb)).transpose(1, 2)
    values = gather_kv(v_cache, tables, nb, ws.get("v", v_cache, len(group) * nb)).transpose(1, 2)
    # Query j of a sequence sits at position seq_len - n + j and sees keys up to it (padding
    # beyond seq_len is therefore masked too).
    q_pos = seq_lens[:, None] - n + torch.arange(n, device=q.device)[None, :]
    mask = torch.arange(nb * block_size, device=q.device)[None, None, :] <= q_pos[:, :, None]
    qi = q[rows].view(len(group), n, *q.shape[1:]).transpose(1, 2)
    oi = F.scaled_dot_product_attention(qi, keys, values, attn_mask=mask[:, None], scale=scale, enable_gqa=True)
    out[rows] = oi.transpose(1, 2).reshape(len(group) * n, *q.shape[1:])
