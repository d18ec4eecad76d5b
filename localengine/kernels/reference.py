"""PyTorch reference for the paged-attention kernels; the CPU execution path.

Decode sequences are batched into one SDPA call over K/V gathered through their block tables
(padded to the longest context, masked). Short queries over a cached prefix (speculative
verification: the last token plus k proposals) are batched the same way, grouped by query length.
With fp32 and the engine's CPU ops (kernels/cpu_ops.cpp), both go instead through its decode
attention, one query token per row with that token's own context length, straight from the paged
cache.
Other prefill chunks run one SDPA call per sequence; a chunk with no cached prefix attends to its
own fresh K/V with a plain causal mask and skips the gather.

Gathers write into a `GatherWorkspace` reused by every layer and step: on CPU, allocating a fresh
tens-of-MB tensor per layer costs more in page faults than the copy itself (measured 5x).

A quantized cache (`kv_scales`, kv_quant.py) is gathered as bytes and converted to the model's
dtype (the stored integers or fp8 values, exact in bf16/fp16/fp32) in a second reused buffer; the
scales never touch the gathered context. Each key channel's scale is folded into the query
(q . (k * s) = (q * s) . k) and each value channel's into the output (sum p (v * s) = (sum p v) * s).
A prefill with no cached prefix attends to its own keys and values as the cache holds them
(quantized), so a prefix-cache hit, a chunked prefill and a plain one see the same numbers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from localengine.kernels import cpu_ops
from localengine.kernels.kv_quant import KVScales, quantize, storage

if TYPE_CHECKING:
    from localengine.layers.attention import AttentionMetadata


def store_kv_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor, kv_scales: KVScales | None = None) -> None:
    """k, v: [tokens, kv_heads, head_dim]; caches: [blocks, block_size, kv_heads, head_dim]."""
    if kv_scales is not None:
        k, v = quantize(k, kv_scales.k_inv, k_cache.dtype), quantize(v, kv_scales.v_inv, v_cache.dtype)
    storage(k_cache).view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, storage(k))
    storage(v_cache).view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, storage(v))


DECODE_GROUP = 16  # decode sequences per SDPA call
# Longest query batched like a decode; per-sequence SDPA calls made verification steps of 8
# requests ~5x slower than plain decode steps on CPU.
MAX_GROUPED_QUERY_LEN = 33


class GatherWorkspace:
    """Two growable buffers (K and V) for gathered context; one per model runner (engine thread)."""

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, like: torch.Tensor, num_blocks: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        shape = (num_blocks, *like.shape[1:])
        dtype = dtype or like.dtype
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < math.prod(shape) or buf.dtype != dtype or buf.device != like.device:
            buf = self.buffers[name] = torch.empty(math.prod(shape) * 5 // 4, dtype=dtype, device=like.device)
        return buf[: math.prod(shape)].view(shape)


def _gather(cache: torch.Tensor, ids: torch.Tensor, num_seqs: int, out: torch.Tensor | None) -> torch.Tensor:
    gathered = torch.index_select(cache, 0, ids, out=out) if out is not None else cache.index_select(0, ids)
    return gathered.view(num_seqs, -1, *cache.shape[2:])


def _context(name: str, cache: torch.Tensor, ids: torch.Tensor, num_seqs: int, ws: GatherWorkspace,
             dtype: torch.dtype) -> torch.Tensor:
    """The blocks `ids` (num_seqs sequences' worth, in order) gathered into the workspace, then (a
    quantized cache) converted to `dtype` in a second buffer."""
    raw = storage(cache)
    gathered = _gather(raw, ids, num_seqs, ws.get(name, raw, ids.shape[0]))
    if cache.dtype == dtype:
        return gathered
    converted = ws.get(name + "_float", cache, ids.shape[0], dtype).view(gathered.shape)
    return converted.copy_(gathered.view(cache.dtype))


def _decode_plan(meta: AttentionMetadata, rows: slice, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A decode group's block ids and key mask: the same for every layer of a step, so made once."""
    key = ("decode", rows.start)
    plan = meta.step_cache.get(key)
    if plan is None:
        nb = -(-max(meta.seq_lens_cpu[rows]) // block_size)
        ids = meta.block_tables[rows, :nb].reshape(-1).long()
        mask = torch.arange(nb * block_size, device=ids.device)[None, :] < meta.seq_lens[rows, None]
        plan = meta.step_cache[key] = (ids, mask[:, None, None, :])
    return plan  # type: ignore[return-value]


def decode_attention_ops(x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         kv_scales: KVScales | None) -> cpu_ops.CpuOps | None:
    """The engine's CPU ops where their decode attention serves this layer (fp32 activations on CPU, an
    fp32 cache, or an int8 or fp8 e4m3fn one with its scales, read in place, heads a multiple of 8 wide),
    else None."""
    ops = cpu_ops.for_fp32(x)
    caches = (torch.int8, torch.float8_e4m3fn) if kv_scales is not None else (torch.float32,)
    if (ops is None or k_cache.dtype not in caches or k_cache.shape[-1] % 8
            or not (k_cache.is_contiguous() and v_cache.is_contiguous())):
        return None
    return ops


def _short_query(n: int, seq_len: int) -> bool:
    """n query tokens after a cached prefix, few enough to batch like decodes (speculative verification)."""
    return n <= MAX_GROUPED_QUERY_LEN and seq_len > n


def row_plan(meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decodes and short queries as rows of the engine's decode attention: each query token's row
    index, its sequence's block table and its own context length (query j of n sees seq_len - n + j + 1
    keys). The same for every layer of a step, so made once."""
    plan = meta.step_cache.get("rows")
    if plan is None:
        starts = meta.query_start_loc_cpu
        rows: list[int] = []
        seqs: list[int] = []
        lens: list[int] = []
        for i, seq_len in enumerate(meta.seq_lens_cpu):
            n = starts[i + 1] - starts[i]
            if i < meta.num_decodes or _short_query(n, seq_len):
                rows += range(starts[i], starts[i] + n)
                seqs += [i] * n
                lens += range(seq_len - n + 1, seq_len + 1)
        device = meta.block_tables.device
        plan = meta.step_cache["rows"] = (torch.tensor(rows, dtype=torch.long, device=device),
                                          meta.block_tables.index_select(0, torch.tensor(seqs, dtype=torch.long, device=device)),
                                          torch.tensor(lens, dtype=torch.int32, device=device))
    return plan  # type: ignore[return-value]


def _per_query_head(scale: torch.Tensor, num_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """[kv_heads, head_dim] -> [heads, head_dim]: query head h reads KV head h // group (SDPA's GQA)."""
    return scale.repeat_interleave(num_heads // scale.shape[0], dim=0).to(dtype)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                    workspace: GatherWorkspace | None = None, kv_scales: KVScales | None = None) -> torch.Tensor:
    """q: [tokens, heads, head_dim], k/v: this step's [tokens, kv_heads, head_dim] (already stored)."""
    ws = workspace or GatherWorkspace()
    if kv_scales is not None:
        q = q * _per_query_head(kv_scales.k, q.shape[1], q.dtype)
    out = torch.empty_like(q)
    block_size = k_cache.shape[1]
    starts = meta.query_start_loc_cpu
    ops = decode_attention_ops(q, k_cache, v_cache, kv_scales)
    if ops is not None:
        # The engine's op reads the paged cache in place (no gather, no mask), one query token per
        # row: a decode, or a token of a short query over a cached prefix (a verification step),
        # which is then computed exactly as the decode of that token would be, so speculation
        # keeps greedy outputs bit for bit.
        rows, tables, lens = row_plan(meta)
        if rows.numel():
            out.index_copy_(0, rows, ops.paged_attention_decode(q.index_select(0, rows), k_cache, v_cache, tables,
                                                                lens, scale))
        short_queries_done = True
    else:
        short_queries_done = False
        # Decodes are padded to the longest context in their group; the model runner sorts them by
        # length, so groups of similar lengths waste little on padding.
        for g in range(0, meta.num_decodes, DECODE_GROUP):
            group_rows = slice(g, min(g + DECODE_GROUP, meta.num_decodes))
            n = group_rows.stop - group_rows.start
            ids, mask = _decode_plan(meta, group_rows, block_size)
            keys = _context("k", k_cache, ids, n, ws, q.dtype).transpose(1, 2)
            values = _context("v", v_cache, ids, n, ws, q.dtype).transpose(1, 2)
            out[group_rows] = F.scaled_dot_product_attention(
                q[group_rows].unsqueeze(2), keys, values, attn_mask=mask, scale=scale, enable_gqa=True
            ).squeeze(2)
    by_len: dict[int, list[int]] = {}
    rest = []
    for i in range(meta.num_decodes, len(meta.seq_lens_cpu)):
        n = starts[i + 1] - starts[i]
        if not _short_query(n, meta.seq_lens_cpu[i]):
            rest.append(i)
        elif not short_queries_done:
            by_len.setdefault(n, []).append(i)
    for n, seqs in by_len.items():
        for g in range(0, len(seqs), DECODE_GROUP):
            group = seqs[g : g + DECODE_GROUP]
            _short_queries(q, out, k_cache, v_cache, meta, scale, ws, group, n)
    for i in rest:
        _prefill(i, q, k, v, out, k_cache, v_cache, meta, scale, ws, kv_scales)
    if kv_scales is not None:
        out *= _per_query_head(kv_scales.v, q.shape[1], q.dtype)
    return out


def _prefill(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor, meta: AttentionMetadata, scale: float, ws: GatherWorkspace,
             kv_scales: KVScales | None) -> None:
    """Sequence i's chunk, one SDPA call: over its own fresh K/V, or over its cached context."""
    block_size = k_cache.shape[1]
    starts = meta.query_start_loc_cpu
    s, e, seq_len = starts[i], starts[i + 1], meta.seq_lens_cpu[i]
    qi = q[s:e].transpose(0, 1)
    if seq_len == e - s:  # no cached prefix: everything this sequence sees was computed now
        ki, vi = k[s:e], v[s:e]
        if kv_scales is not None:  # as stored, unscaled (the scales are folded into q and out)
            ki = quantize(ki, kv_scales.k_inv, k_cache.dtype).to(q.dtype)
            vi = quantize(vi, kv_scales.v_inv, v_cache.dtype).to(q.dtype)
        # 4-D inputs: PyTorch's CPU flash kernel takes only [batch, heads, len, dim]; 3-D ones fall
        # to the unfused math path (bmm, softmax, masks), 3x slower for a 500-token chunk.
        oi = F.scaled_dot_product_attention(qi[None], ki.transpose(0, 1)[None], vi.transpose(0, 1)[None],
                                            is_causal=True, scale=scale, enable_gqa=True)[0]
    else:
        nb = -(-seq_len // block_size)
        ids = meta.block_tables[i, :nb].long()
        ki = _context("k", k_cache, ids, 1, ws, q.dtype)[0, :seq_len]
        vi = _context("v", v_cache, ids, 1, ws, q.dtype)[0, :seq_len]
        ki, vi = ki.transpose(0, 1), vi.transpose(0, 1)
        q_pos = torch.arange(seq_len - (e - s), seq_len, device=q.device)
        mask = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None]
        oi = F.scaled_dot_product_attention(qi[None], ki[None], vi[None], attn_mask=mask, scale=scale,
                                            enable_gqa=True)[0]
    out[s:e] = oi.transpose(0, 1)


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
    ids = tables[:, :nb].reshape(-1).long()
    keys = _context("k", k_cache, ids, len(group), ws, q.dtype).transpose(1, 2)
    values = _context("v", v_cache, ids, len(group), ws, q.dtype).transpose(1, 2)
    # Query j of a sequence sits at position seq_len - n + j and sees keys up to it (padding
    # beyond seq_len is therefore masked too).
    q_pos = seq_lens[:, None] - n + torch.arange(n, device=q.device)[None, :]
    mask = torch.arange(nb * block_size, device=q.device)[None, None, :] <= q_pos[:, :, None]
    qi = q[rows].view(len(group), n, *q.shape[1:]).transpose(1, 2)
    oi = F.scaled_dot_product_attention(qi, keys, values, attn_mask=mask[:, None], scale=scale, enable_gqa=True)
    out[rows] = oi.transpose(1, 2).reshape(len(group) * n, *q.shape[1:])
