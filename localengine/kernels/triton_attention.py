"""Triton kernels for the paged KV cache, used on CUDA (and on CPU only by the interpreter tests).

- `store_kv_cache`: one program per token copies its K and V rows into the token's cache slot
  (nano-vllm's kernel, masked so head sizes need not be powers of two).
- `paged_attention`: one kernel for decode, prefill and chunked prefill over a cached prefix.
  Program (sequence, query head, block of BLOCK_M query tokens) walks the sequence's context in
  tiles of BLOCK_N positions, looking up each position's physical block in the block table (the
  tile size is independent of the cache block size, as in vLLM's unified kernel), with the causal
  limit `key_pos <= context_before_chunk + query_pos` and an online softmax in fp32.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

if TYPE_CHECKING:
    from localengine.layers.attention import AttentionMetadata


@triton.jit
def _store_kv_cache_kernel(K, V, K_cache, V_cache, slot_mapping, D: tl.constexpr, BLOCK_D: tl.constexpr):
    idx = tl.program_id(0)
    slot = tl.load(slot_mapping + idx)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    tl.store(K_cache + slot * D + offs, tl.load(K + idx * D + offs, mask=mask), mask=mask)
    tl.store(V_cache + slot * D + offs, tl.load(V + idx * D + offs, mask=mask), mask=mask)


def store_kv_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """k, v: [tokens, kv_heads, head_dim] contiguous; caches: [blocks, block_size, kv_heads, head_dim]."""
    d = k.shape[1] * k.shape[2]
    _store_kv_cache_kernel[(k.shape[0],)](k, v, k_cache, v_cache, slot_mapping, D=d,
                                          BLOCK_D=triton.next_power_of_2(d))


@triton.jit
def _paged_attention_kernel(
    Q, K_cache, V_cache, Out, block_tables, seq_lens, query_start_loc, scale,
    stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_ot, stride_oh, stride_bt,
    QUERIES_PER_KV: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    m_block = tl.program_id(2)
    q_start = tl.load(query_start_loc + seq)
    q_len = tl.load(query_start_loc + seq + 1) - q_start
    if m_block * BLOCK_M < q_len:
        seq_len = tl.load(seq_lens + seq)
        context = seq_len - q_len  # positions cached before this chunk
        kv_head = head // QUERIES_PER_KV
        offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        m_mask = offs_m < q_len
        d_mask = offs_d < HEAD_DIM
        q = tl.load(Q + (q_start + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
                    mask=m_mask[:, None] & d_mask[None, :], other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        # Keys past the last query of this block are masked anyway: stop the loop there.
        end = tl.minimum(seq_len, context + (m_block + 1) * BLOCK_M)
        for start in range(0, end, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            n_mask = offs_n < seq_len
            block_ids = tl.load(block_tables + seq * stride_bt + offs_n // BLOCK_SIZE, mask=n_mask, other=0)
            kv_off = block_ids.to(tl.int64) * stride_kb + (offs_n % BLOCK_SIZE) * stride_ks + kv_head * stride_kh
            k = tl.load(K_cache + kv_off[None, :] + offs_d[:, None], mask=n_mask[None, :] & d_mask[:, None], other=0.0)
            s = tl.dot(q, k, input_precision=DOT_PRECISION).to(tl.float32) * scale
            visible = (offs_n[None, :] <= (context + offs_m)[:, None]) & n_mask[None, :]
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V_cache + kv_off[:, None] + offs_d[None, :], mask=n_mask[:, None] & d_mask[None, :], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION).to(tl.float32)
            m_i = m_new
        acc = acc / l_i[:, None]
        tl.store(Out + (q_start + offs_m)[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
                 acc.to(Out.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float, block_m: int = 16, block_n: int = 32) -> torch.Tensor:
    """q: [tokens, heads, head_dim]; this step's K/V must already be in the cache."""
    num_seqs = len(meta.seq_lens_cpu)
    num_heads, head_dim = q.shape[1], q.shape[2]
    out = torch.empty_like(q)
    grid = (num_seqs, num_heads, triton.cdiv(meta.max_query_len, block_m))
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, out, meta.block_tables, meta.seq_lens, meta.query_start_loc, scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1), meta.block_tables.stride(0),
        QUERIES_PER_KV=num_heads // k_cache.shape[2], BLOCK_SIZE=k_cache.shape[1], HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_M=block_m, BLOCK_N=block_n,
        # fp32 models get fp32 dot products, not TF32 (which would break parity with the reference).
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    return out
