"""The engine's own CPU ops against a dequantized fp32 GEMM, by rows: what sets `cpu_ops.MAX_ROWS`.

SmolLM2-135M's 120 linear shapes (qkv 960x576, o 576x576, gate_up 3072x576, down 576x1536, 30 layers)
with random weights, fp32 and quantized to int8 (per row) and int4 (groups of 32); each matmul run
through the kernels, then through PyTorch's F.linear (fp32: MKL's sgemm; quantized: dequantize +
F.linear, what a prefill does), for 1 to 64 rows (5 and 9: verification steps of 4 and 8 proposals). On a
CPU whose PyTorch capability is AVX512 the fp32 and int8 ops run in their AVX-512 forms, and two more
columns show the same ops narrowed to their AVX2 forms.

Then decode attention with SmolLM2's heads (9 query, 3 KV, 64 wide), 16-token blocks scattered over a
pool: the engine's `paged_attention_decode` over an fp32, int8 and fp8 cache against SDPA over the
gathered blocks (the PyTorch path: gather, mask, SDPA), per layer call, for 1, 5 and 9 rows (a decode,
verification steps of 4 and 8 proposals) at contexts of 500 and 1,000 tokens.

    python bench/localengine/cpu_ops.py --threads 2
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from localengine.kernels import cpu_ops
from localengine.layers.quantization import Int4BlockWeight, Int4Values, Int8Weight, float_linear

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
WIDE = torch.backends.cpu.get_cpu_capability() == "AVX512"  # the ops' own choice (kernels/cpu_ops.py)


@dataclass(frozen=True)
class FloatWeight:
    """An fp32 weight as the engine's linears run it (float_linear), beside the quantized ones."""

    weight: torch.Tensor

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return float_linear(x, self.weight)

    def dequantize(self) -> torch.Tensor:
        return self.weight


def timed(weights: Sequence[FloatWeight | Int8Weight | Int4BlockWeight], rows: int, kernel: bool, repeats: int,
          avx512: bool = WIDE) -> float:
    """Milliseconds for one pass over every weight."""
    cpu_ops.MAX_ROWS = 1 << 30 if kernel else 0
    cpu_ops.built().use_avx512(avx512)
    xs = [torch.randn(rows, w.dequantize().shape[1]) for w in weights]
    for w, x in zip(weights, xs, strict=True):
        w.matmul(x)
    start = time.perf_counter()
    for _ in range(repeats):
        for w, x in zip(weights, xs, strict=True):
            w.matmul(x)
    return (time.perf_counter() - start) / repeats * 1000


def attention_us(rows: int, context: int, cache: str, kernel: bool, repeats: int) -> float:
    """Microseconds for one layer's decode attention over `rows` query tokens of one sequence (row j sees
    context + j keys), SmolLM2's heads."""
    heads, kv_heads, d, block = 9, 3, 64, 16
    blocks = -(-(context + rows) // block)
    dtype = {"fp32": torch.float32, "int8": torch.int8, "fp8": torch.float8_e4m3fn}[cache]
    # Two pools, as the engine has: one pool read as both would find the values in cache after the keys.
    k_cache, v_cache = (torch.randn(4 * blocks, block, kv_heads, d).to(dtype) for _ in range(2))
    table = torch.randperm(4 * blocks)[:blocks].to(torch.int32)
    tables, lens = table.repeat(rows, 1), torch.arange(context + 1, context + rows + 1, dtype=torch.int32)
    q = torch.randn(rows, heads, d)
    ids = table.long()

    def run() -> None:
        if kernel:
            cpu_ops.built().paged_attention_decode(q, k_cache, v_cache, tables, lens, d**-0.5)
            return
        keys = k_cache[ids].float().reshape(-1, kv_heads, d).transpose(0, 1)[None].expand(rows, -1, -1, -1)
        values = v_cache[ids].float().reshape(-1, kv_heads, d).transpose(0, 1)[None].expand(rows, -1, -1, -1)
        mask = torch.arange(blocks * block)[None, :] < lens[:, None]
        F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=mask[:, None, None, :], scale=d**-0.5,
                                       enable_gqa=True)

    run()
    start = time.perf_counter()
    for _ in range(repeats * 20):
        run()
    return (time.perf_counter() - start) / (repeats * 20) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if cpu_ops.ops() is None:
        raise SystemExit("the engine's CPU ops are not built here (no AVX2 or no compiler)")
    floats = [torch.randn(o, i) * 0.02 for _ in range(30) for o, i in SHAPES]
    int8 = [Int8Weight.from_float(w) for w in floats]
    int4 = [Int4BlockWeight.from_values(Int4Values.from_float(w, 32)) for w in floats]
    print(f"120 linears of SmolLM2's shapes, {args.threads} threads, ms per pass  (load {os.getloadavg()[0]:.2f})")
    fp32 = [FloatWeight(w) for w in floats]
    narrowed = " | fp32 ops (AVX2) | int8 ops (AVX2)" if WIDE else ""
    print(f"| rows | fp32 ops | fp32 PyTorch | int8 ops | int8 dequantized | int4 ops | int4 dequantized{narrowed} |\n"
          "|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if WIDE else ""))
    for rows in (1, 2, 4, 5, 8, 9, 16, 32, 64):
        cells = [timed(fp32, rows, True, args.repeats), timed(fp32, rows, False, args.repeats),
                 timed(int8, rows, True, args.repeats), timed(int8, rows, False, args.repeats),
                 timed(int4, rows, True, args.repeats), timed(int4, rows, False, args.repeats)]
        if WIDE:
            cells += [timed(fp32, rows, True, args.repeats, avx512=False), timed(int8, rows, True, args.repeats, avx512=False)]
        print(f"| {rows} | " + " | ".join(f"{c:.1f}" for c in cells) + " |", flush=True)
    cpu_ops.built().use_avx512(WIDE)
    print(f"\ndecode attention, SmolLM2's heads (9, 3 KV, 64 wide), us per layer call  (load {os.getloadavg()[0]:.2f})")
    print("| rows | context | op, fp32 cache | op, int8 cache | op, fp8 cache | SDPA over gathered blocks (fp32) |\n"
          "|---:|---:|---:|---:|---:|---:|")
    for rows in (1, 5, 9):
        for context in (500, 1000):
            cells = [attention_us(rows, context, cache, True, args.repeats) for cache in ("fp32", "int8", "fp8")]
            cells.append(attention_us(rows, context, "fp32", False, args.repeats))
            print(f"| {rows} | {context} | " + " | ".join(f"{c:.0f}" for c in cells) + " |", flush=True)
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
