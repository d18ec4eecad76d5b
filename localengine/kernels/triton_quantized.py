"""Weight-only int4 and int8 matmuls on CUDA (and on CPU only by the interpreter tests): x @ W^T with W
kept quantized, in the layouts the CPU kernels read (layers/quantization.py).

- int4 (`Int4BlockWeight`): W [N, K] in blocks of 32 inputs, 16 bytes a block, byte j holding input j in
  its low nibble and input j + 16 in its high one (GGUF's Q4 order); each group of G inputs (a multiple
  of 32) of each output row has a scale and an offset, w = q * scale + offset.
- int8 (`Int8Weight`): q int8 [N, K] with one scale per output row.

Decode rows (up to DECODE_ROWS) take a split-K kernel: program (rows, BLOCK_N outputs, K segment)
walks its segment a 32-input block at a time, multiplies the block's low and high nibbles with the
inputs they hold (the products are summed in another order, never unpacked into W's order), and
applies the group's scale and offset once per block: sum x (q s + o) = s sum x q + o sum x. The
segments' partial sums are added afterwards, so a small layer (SmolLM2's 576 outputs) still spreads
over the GPU's SMs. The weight never exists as floats in memory: a decode step streams a quarter of
bf16's bytes (int8: half). Longer chunks (a prefill) dequantize W to x's dtype once for the call
and take cuBLAS: a GEMM reuses each weight across rows, where unpacking inside a tensor-core loop
would cost more than the one pass over W.

fp32 activations are multiplied in IEEE fp32 (not TF32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

DECODE_ROWS = 16  # the smallest tl.dot tile; more rows: dequantize once and take cuBLAS
# Output features a decode program takes, and Triton's software pipelining of its loop: the best of
# 32 / 64 / 128 x 1 / 3 summed over SmolLM2's and a 4096 x 4096 layer at 1 and 16 rows (H200,
# `bench/localengine/cuda_weights.py --sweep`; single timings of these microsecond kernels moved by 2x).
BLOCK_N = 128
NUM_STAGES = 1
# Programs to aim for: a few per SM, so that memory requests overlap (H100 / H200: 132 SMs).
TARGET_PROGRAMS = 512
MIN_BLOCKS_PER_PROGRAM = 4  # 32-input blocks: fewer and the partial sums cost more than they spread


@triton.jit
def _int4_gemv_kernel(x_ptr, packed_ptr, scale_ptr, offset_ptr, part_ptr, M, N, K, stride_xm,
                      blocks_per_split, GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      IEEE: tl.constexpr):
    pid_m, pid_n, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    half = tl.arange(0, 16)
    row_ok, col_ok = rm < M, rn < N
    groups = K // GROUP_SIZE
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    first = split * blocks_per_split
    for blk in range(first, tl.minimum(first + blocks_per_split, K // 32)):
        x_lo = tl.load(x_ptr + rm[:, None] * stride_xm + blk * 32 + half[None, :], mask=row_ok[:, None], other=0.0)
        x_hi = tl.load(x_ptr + rm[:, None] * stride_xm + blk * 32 + 16 + half[None, :], mask=row_ok[:, None], other=0.0)
        b = tl.load(packed_ptr + rn[None, :] * (K // 2) + blk * 16 + half[:, None], mask=col_ok[None, :], other=0)
        b = b.to(tl.int32)
        q_lo = (b & 15).to(x_lo.dtype)  # [16, BLOCK_N], exact in every float type
        q_hi = (b >> 4).to(x_lo.dtype)
        if IEEE:
            dots = tl.dot(x_lo, q_lo, input_precision="ieee") + tl.dot(x_hi, q_hi, input_precision="ieee")
        else:
            dots = tl.dot(x_lo, q_lo) + tl.dot(x_hi, q_hi)
        # The block's group: one scale and offset per output, applied to the block's sums.
        at = rn * groups + (blk * 32) // GROUP_SIZE
        scale = tl.load(scale_ptr + at, mask=col_ok, other=0.0)
        offset = tl.load(offset_ptr + at, mask=col_ok, other=0.0)
        x_sum = tl.sum(x_lo.to(tl.float32), axis=1) + tl.sum(x_hi.to(tl.float32), axis=1)
        acc += dots * scale[None, :] + x_sum[:, None] * offset[None, :]
    part = part_ptr + split * M * N + rm[:, None] * N + rn[None, :]
    tl.store(part, acc, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _int8_gemv_kernel(x_ptr, q_ptr, scale_ptr, part_ptr, M, N, K, stride_xm, blocks_per_split,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
    pid_m, pid_n, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, 32)
    row_ok, col_ok = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    first = split * blocks_per_split
    for blk in range(first, tl.minimum(first + blocks_per_split, tl.cdiv(K, 32))):
        k = blk * 32 + rk
        k_ok = k < K
        x = tl.load(x_ptr + rm[:, None] * stride_xm + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        q = tl.load(q_ptr + rn[None, :] * K + k[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0).to(x.dtype)
        if IEEE:
            acc += tl.dot(x, q, input_precision="ieee")
        else:
            acc += tl.dot(x, q)
    scale = tl.load(scale_ptr + rn, mask=col_ok, other=0.0).to(tl.float32)
    part = part_ptr + split * M * N + rm[:, None] * N + rn[None, :]
    tl.store(part, acc * scale[None, :], mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _int4_dequantize_kernel(packed_ptr, scale_ptr, offset_ptr, out_ptr, N, K, GROUP_SIZE: tl.constexpr,
                            BLOCK_N: tl.constexpr):
    """out [N, K] in out's dtype; program (BLOCK_N rows, one 32-input block)."""
    pid_n, blk = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.arange(0, 32)
    ok = (rn < N)[:, None]
    b = tl.load(packed_ptr + rn[:, None] * (K // 2) + blk * 16 + (j % 16)[None, :], mask=ok, other=0).to(tl.int32)
    q = ((b >> ((j // 16) * 4)[None, :]) & 15).to(tl.float32)
    at = rn * (K // GROUP_SIZE) + (blk * 32) // GROUP_SIZE
    scale = tl.load(scale_ptr + at, mask=rn < N, other=0.0)
    offset = tl.load(offset_ptr + at, mask=rn < N, other=0.0)
    w = q * scale[:, None] + offset[:, None]
    tl.store(out_ptr + rn[:, None] * K + blk * 32 + j[None, :], w.to(out_ptr.dtype.element_ty), mask=ok)


def _splits(row_tiles: int, n: int, blocks: int, block_n: int) -> tuple[int, int]:
    """(segments K is cut into, 32-input blocks per segment) for a grid of row_tiles x column tiles."""
    tiles = row_tiles * triton.cdiv(n, block_n)
    splits = max(1, min(TARGET_PROGRAMS // tiles, blocks // MIN_BLOCKS_PER_PROGRAM))
    per_split = triton.cdiv(blocks, splits)
    return triton.cdiv(blocks, per_split), per_split


def _gemv(kernel, x: torch.Tensor, n: int, blocks: int, *weight: object, block_n: int, **constants: object) -> torch.Tensor:
    m = x.shape[0]
    block_m = 16
    splits, per_split = _splits(triton.cdiv(m, block_m), n, blocks, block_n)
    parts = torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), splits)
    kernel[grid](x, *weight, parts, m, n, x.shape[1], x.stride(0), per_split, BLOCK_M=block_m, BLOCK_N=block_n,
                 IEEE=x.dtype == torch.float32, num_stages=NUM_STAGES, **constants)
    return (parts[0] if splits == 1 else parts.sum(0)).to(x.dtype)


def int4_dequantize(packed: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, group_size: int,
                    dtype: torch.dtype) -> torch.Tensor:
    n, k = packed.shape[0], packed.shape[1] * 2
    out = torch.empty((n, k), dtype=dtype, device=packed.device)
    _int4_dequantize_kernel[(triton.cdiv(n, 32), k // 32)](packed, scale, offset, out, n, k, GROUP_SIZE=group_size,
                                                           BLOCK_N=32)
    return out


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                group_size: int, block_n: int | None = None) -> torch.Tensor:
    """x [M, K] (fp32, fp16 or bf16) @ W^T for W in `Int4BlockWeight`'s layout: packed uint8 [N, K / 2],
    scale and offset fp32 [N, K / group_size]. Returns [M, N] in x's dtype."""
    m, k = x.shape
    if k % 32 or k % group_size or group_size % 32 or packed.shape[1] * 2 != k:
        raise ValueError(f"int4 weight of {packed.shape[1] * 2} inputs in groups of {group_size} does not take "
                         f"rows of {k}")
    x = x.contiguous()
    if m > DECODE_ROWS:
        return torch.nn.functional.linear(x, int4_dequantize(packed, scale, offset, group_size, x.dtype))
    return _gemv(_int4_gemv_kernel, x, packed.shape[0], k // 32, packed, scale, offset, block_n=block_n or BLOCK_N,
                 GROUP_SIZE=group_size)


def int8_matmul(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ (q * scale[:, None])^T for q int8 [N, K]; returns [M, N] in x's dtype."""
    x = x.contiguous()
    if x.shape[0] > DECODE_ROWS:
        return torch.nn.functional.linear(x, q.to(x.dtype) * scale.to(x.dtype)[:, None])
    return _gemv(_int8_gemv_kernel, x, q.shape[0], triton.cdiv(q.shape[1], 32), q, scale, block_n=BLOCK_N)
