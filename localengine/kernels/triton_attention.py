"""Triton kernels for the paged KV cache, used on CUDA (and on CPU only by the interpreter tests).

- `store_kv_cache`: one program per token copies its K and V rows into the token's cache slot
  (nano-vllm's kernel, masked so head sizes need not be powers of two).
- `paged_attention`: one kernel for decode, prefill and chunked prefill over a cached prefix, in
  the layout of vLLM's unified Triton attention. Program (sequence, KV head, block of query tokens)
  stacks the query heads that share the KV head: its [BLOCK_M, head_dim] query tile holds BLOCK_Q
  tokens x QUERIES_PER_KV heads, so each K/V tile is loaded once per KV head rather than once per
  query head (GQA/MQA), and decode still fills a tensor-core-sized tile. The program walks the
  context in tiles of BLOCK_N positions, looking up each position's physical block in the block
  table (the tile size is independent of the cache block size), with the causal limit
  `key_pos <= context_before_chunk + query_pos` and an online softmax in fp32 (base 2).
- Split-KV ("flash-decoding"): when a decode batch has too few (sequence, KV head) programs to fill
  the GPU, a third grid axis cuts each context into `num_splits` segments computed in parallel;
  each writes its unnormalised output with its running max and sum, and `_reduce_splits_kernel`
  merges them. The segment length is computed in the kernel from the sequence's own length, so the
  grid depends only on the batch shape and the split count changes how work is divided, never
  the result.
- Quantized cache (kv_cache_dtype int8/fp8, kv_quant.py): the store kernel scales, rounds and
  saturates each element into its byte; the attention kernel converts the loaded bytes to the
  query's dtype, with each key channel's scale folded into the query tile once per program and
  each value channel's into the accumulator at the end, so the inner loop is unchanged but for
  the conversion.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

if TYPE_CHECKING:
    from localengine.kernels.kv_quant import KVScales
    from localengine.layers.attention import AttentionMetadata

LOG2E = 1.4426950408889634
MAX_SPLITS = 16  # vLLM's 3D decode kernel uses 16 segments
MIN_SPLIT_LEN = 128  # context positions per segment below which splitting costs more than it gains
# Stands in for the SM count where there is no CUDA device (the interpreter tests): an H100 SXM.
DEFAULT_NUM_SMS = 132


@triton.jit
def _round_to_e4m3(y):
    """fp32 y (|y| <= 448) rounded to nearest-even on e4m3's grid, so that the conversion after it
    is exact. A GPU's conversion rounds by itself, but Triton's interpreter (the tests) does not
    carry a rounded-up mantissa into the exponent (7.9 became 4.0). Adding and subtracting
    1.5 * 2^(s + 23) rounds to a multiple of 2^s in fp32's own round-to-nearest-even, where 2^s is
    e4m3's spacing at y: 3 mantissa bits, subnormal below 2^-6."""
    exp = ((y.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # floor(log2 |y|)
    step = tl.maximum(exp, -6) - 3
    magic = (((step + 23 + 127) << 23) | (1 << 22)).to(tl.float32, bitcast=True)
    return (y + magic) - magic


@triton.jit
def _quantize(x, inv_scale, QMAX: tl.constexpr, INT8: tl.constexpr):
    """kv_quant.quantize: scale, saturate, round (int8: to nearest, ties up; e4m3: to nearest even)."""
    y = tl.minimum(tl.maximum(x.to(tl.float32) * inv_scale, -QMAX), QMAX)
    if INT8:
        y = tl.floor(y + 0.5)
    else:
        y = _round_to_e4m3(y)
    return y


@triton.jit
def _store_kv_cache_kernel(K, V, K_cache, V_cache, K_inv, V_inv, slot_mapping, D: tl.constexpr,
                           BLOCK_D: tl.constexpr, QUANT: tl.constexpr, QMAX: tl.constexpr, INT8: tl.constexpr):
    idx = tl.program_id(0)
    slot = tl.load(slot_mapping + idx).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    k = tl.load(K + idx * D + offs, mask=mask)
    v = tl.load(V + idx * D + offs, mask=mask)
    if QUANT:  # scales are [kv_heads, head_dim], the same flat layout as a token's row
        k = _quantize(k, tl.load(K_inv + offs, mask=mask, other=0.0), QMAX, INT8)
        v = _quantize(v, tl.load(V_inv + offs, mask=mask, other=0.0), QMAX, INT8)
    tl.store(K_cache + slot * D + offs, k.to(K_cache.dtype.element_ty), mask=mask)
    tl.store(V_cache + slot * D + offs, v.to(V_cache.dtype.element_ty), mask=mask)


def store_kv_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor, kv_scales: KVScales | None = None) -> None:
    """k, v: [tokens, kv_heads, head_dim] contiguous; caches: [blocks, block_size, kv_heads, head_dim]."""
    d = k.shape[1] * k.shape[2]
    k_inv, v_inv, qmax = k, v, 0.0  # unread unquantized
    if kv_scales is not None:
        k_inv, v_inv = kv_scales.k_inv, kv_scales.v_inv
        qmax = 127.0 if k_cache.dtype == torch.int8 else float(torch.finfo(k_cache.dtype).max)
    _store_kv_cache_kernel[(k.shape[0],)](
        k, v, k_cache, v_cache, k_inv, v_inv, slot_mapping, D=d, BLOCK_D=triton.next_power_of_2(d),
        QUANT=kv_scales is not None, QMAX=qmax, INT8=k_cache.dtype == torch.int8,
    )


@triton.jit
def _paged_attention_kernel(
    Q, K_cache, V_cache, K_scale, V_scale, Out, PartAcc, PartMax, PartSum, block_tables, seq_lens, query_start_loc,
    qk_scale, num_splits,
    stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_ot, stride_oh, stride_bt,
    stride_ps, stride_pt, stride_ph, stride_ms, stride_mt,
    QUERIES_PER_KV: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr, QUANT: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_block = tl.program_id(2) // num_splits  # num_splits == 1 is a compile-time constant to Triton
    split = tl.program_id(2) % num_splits
    q_start = tl.load(query_start_loc + seq)
    q_len = tl.load(query_start_loc + seq + 1) - q_start
    if q_block * BLOCK_Q < q_len:
        seq_len = tl.load(seq_lens + seq)
        context = seq_len - q_len  # positions cached before this chunk
        # Row r of the tile is query token r // QUERIES_PER_KV, head r % QUERIES_PER_KV of the group.
        offs_m = tl.arange(0, BLOCK_M)
        q_pos = q_block * BLOCK_Q + offs_m // QUERIES_PER_KV
        head = kv_head * QUERIES_PER_KV + offs_m % QUERIES_PER_KV
        m_mask = (offs_m < BLOCK_Q * QUERIES_PER_KV) & (q_pos < q_len)
        offs_d = tl.arange(0, BLOCK_D)
        d_mask = offs_d < HEAD_DIM
        q = tl.load(Q + (q_start + q_pos)[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                    mask=m_mask[:, None] & d_mask[None, :], other=0.0)
        if QUANT:  # q . (k * s) = (q * s) . k: the key scales enter once, not per key
            k_scale = tl.load(K_scale + kv_head * HEAD_DIM + offs_d, mask=d_mask, other=0.0)
            q = (q.to(tl.float32) * k_scale[None, :]).to(Q.dtype.element_ty)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        # Keys past the last query of this block are masked anyway: stop the loop there.
        hi = tl.minimum(seq_len, context + (q_block + 1) * BLOCK_Q)
        lo = 0
        if SPLIT:
            # Segments are whole tiles, so a tile never straddles two of them.
            segment = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
            lo = split * segment
            hi = tl.minimum(hi, lo + segment)
        for start in range(lo, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            n_mask = offs_n < hi
            block_ids = tl.load(block_tables + seq * stride_bt + offs_n // BLOCK_SIZE, mask=n_mask, other=0)
            kv_off = block_ids.to(tl.int64) * stride_kb + (offs_n % BLOCK_SIZE) * stride_ks + kv_head * stride_kh
            k = tl.load(K_cache + kv_off[None, :] + offs_d[:, None], mask=n_mask[None, :] & d_mask[:, None], other=0.0)
            k = k.to(Q.dtype.element_ty)  # a no-op unless the cache is quantized
            s = tl.dot(q, k, input_precision=DOT_PRECISION).to(tl.float32) * qk_scale
            visible = (offs_n[None, :] <= (context + q_pos)[:, None]) & n_mask[None, :]
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # A row that has seen no visible key yet (a segment before its causal limit) keeps
            # m = -inf; exponentiate against 0 there so that it stays 0 instead of NaN.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(s - m_safe[:, None])
            alpha = tl.math.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V_cache + kv_off[:, None] + offs_d[None, :], mask=n_mask[:, None] & d_mask[None, :], other=0.0)
            v = v.to(Q.dtype.element_ty)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION).to(tl.float32)
            m_i = m_new
        if QUANT:  # sum p (v * s) = (sum p v) * s; the split path's partial sums merge linearly
            acc = acc * tl.load(V_scale + kv_head * HEAD_DIM + offs_d, mask=d_mask, other=0.0)[None, :]
        tok = q_start + q_pos
        if SPLIT:
            part = split * stride_ps + tok * stride_pt + head * stride_ph
            tl.store(PartAcc + part[:, None] + offs_d[None, :], acc, mask=m_mask[:, None] & d_mask[None, :])
            stat = split * stride_ms + tok * stride_mt + head
            tl.store(PartMax + stat, m_i, mask=m_mask)
            tl.store(PartSum + stat, l_i, mask=m_mask)
        else:
            acc = acc / l_i[:, None]
            tl.store(Out + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
                     acc.to(Out.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


@triton.jit
def _reduce_splits_kernel(
    Out, PartAcc, PartMax, PartSum, num_splits,
    stride_ot, stride_oh, stride_ps, stride_pt, stride_ph, stride_ms, stride_mt,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS_P2: tl.constexpr,
):
    """Program (token, head): out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s."""
    tok = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_P2)
    s_mask = offs_s < num_splits
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    stat = offs_s * stride_ms + tok * stride_mt + head
    m = tl.load(PartMax + stat, mask=s_mask, other=float("-inf"))
    l_s = tl.load(PartSum + stat, mask=s_mask, other=0.0)
    # The first segment always holds key 0, which every query sees: the max is finite.
    weight = tl.math.exp2(m - tl.max(m, 0))  # empty segments (m = -inf) weigh 0
    total = tl.sum(weight * l_s, 0)
    part = offs_s[:, None] * stride_ps + tok * stride_pt + head * stride_ph + offs_d[None, :]
    acc = tl.load(PartAcc + part, mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    out = tl.sum(acc * weight[:, None], 0) / total
    tl.store(Out + tok * stride_ot + head * stride_oh + offs_d, out.to(Out.dtype.element_ty), mask=d_mask)


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return DEFAULT_NUM_SMS
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_query_len: int, max_seq_len: int,
                      sms: int) -> int:
    """Segments per context: 1 (no split) unless a decode-only batch leaves SMs idle.

    A decode batch launches num_seqs x num_kv_heads programs; with fewer than the GPU has SMs, each
    walks a whole context alone (batch-1 decode of a long context on an H100 with 8 KV heads
    occupies 8 of 132 SMs). Split until the programs cover the SMs, at most MAX_SPLITS and no
    segment shorter than MIN_SPLIT_LEN; powers of two bound the compiled reduce variants.
    Prefill and chunked prefill keep the unsplit path: their query blocks already fill the grid.
    """
    if max_query_len > 1:
        return 1
    splits = min(MAX_SPLITS, sms // max(1, num_seqs * num_kv_heads), max_seq_len // MIN_SPLIT_LEN)
    return 1 if splits < 2 else 1 << (splits.bit_length() - 1)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float, block_n: int = 32, num_splits: int | None = None,
                    kv_scales: KVScales | None = None) -> torch.Tensor:
    """q: [tokens, heads, head_dim]; this step's K/V must already be in the cache (quantized with
    `kv_scales` when those are given).

    num_splits: segments per context (None: `choose_num_splits`); any value gives the same result.
    """
    num_seqs = len(meta.seq_lens_cpu)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    queries_per_kv = num_heads // num_kv_heads
    # Rows of the query tile: at least 16 (tl.dot's minimum on tensor cores), all heads of a group.
    block_m = max(16, triton.next_power_of_2(queries_per_kv))
    block_q = block_m // queries_per_kv
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, meta.max_query_len, max(meta.seq_lens_cpu),
                                       num_sms(q.device))
    split = num_splits > 1
    out = torch.empty_like(q)
    if split:
        part_acc = torch.empty(num_splits, num_tokens, num_heads, head_dim, dtype=torch.float32, device=q.device)
        part_max = torch.empty(num_splits, num_tokens, num_heads, dtype=torch.float32, device=q.device)
        part_sum = torch.empty_like(part_max)
    else:  # unused by the unsplit kernel
        part_acc = part_max = part_sum = out
    grid = (num_seqs, num_kv_heads, triton.cdiv(meta.max_query_len, block_q) * num_splits)
    k_scale, v_scale = (kv_scales.k, kv_scales.v) if kv_scales is not None else (q, q)  # unread unquantized
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, k_scale, v_scale, out, part_acc, part_max, part_sum, meta.block_tables, meta.seq_lens,
        meta.query_start_loc, scale * LOG2E, num_splits,  # softmax in base 2: exp2 is cheaper
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1), meta.block_tables.stride(0),
        part_acc.stride(0), part_acc.stride(1), part_acc.stride(2), part_max.stride(0), part_max.stride(1),
        QUERIES_PER_KV=queries_per_kv, BLOCK_SIZE=k_cache.shape[1], HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_N=block_n,
        SPLIT=split,
        # fp32 models get fp32 dot products, not TF32 (which would break parity with the reference).
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        QUANT=kv_scales is not None,
    )
    if split:
        _reduce_splits_kernel[(num_tokens, num_heads)](
            out, part_acc, part_max, part_sum, num_splits,
            out.stride(0), out.stride(1), part_acc.stride(0), part_acc.stride(1), part_acc.stride(2),
            part_max.stride(0), part_max.stride(1),
            HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
            SPLITS_P2=triton.next_power_of_2(num_splits),
        )
    return out
