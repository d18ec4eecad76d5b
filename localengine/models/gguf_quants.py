"""GGUF's 4-bit blocks as the engine's int4 groups (layers/quantization.py), without a float copy.

Every 4-bit GGML format used by Llama-family files is "4-bit integers, and per 32 values one scale
and one offset", so each maps value for value onto w = (q - 8) * scale + zero at group 32:
- Q4_0 (fp16 d; w = d (q - 8)): scale d, zero 0.
- Q4_1 (fp16 d, m; w = d q + m): scale d, zero m + 8 d.
- Q4_K (256-value super-blocks: fp16 d and dmin, 8 sub-blocks of 32 with 6-bit scale sc and
  minimum mn; w = d sc q - dmin mn): scale d sc, zero 8 d sc - dmin mn.
The nibbles are kept exactly; scale and zero are computed in fp32 here (exact for these products)
and rounded to bf16 when packed for the kernel.

Other quantized types (Q8_0, Q5_*, Q6_K, ...) have more than 4 bits: the loader dequantizes them
exactly and requantizes to int8 per row (see loader.py).
"""

from __future__ import annotations

import numpy as np
import torch

from localengine.layers.quantization import Int4Values

GROUP = 32


def int4_types() -> frozenset[int]:
    from gguf import GGMLQuantizationType as T

    return frozenset({int(T.Q4_0), int(T.Q4_1), int(T.Q4_K)})


def int4_values(data: torch.Tensor, ggml_type: int, shape: tuple[int, ...]) -> Int4Values:
    """A 2-D Q4_0 / Q4_1 / Q4_K tensor's raw bytes as 4-bit groups of 32 (rows first, as `shape`)."""
    from gguf import GGMLQuantizationType as T

    rows, cols = shape
    kind = T(ggml_type)
    raw = data.numpy()
    if kind in (T.Q4_0, T.Q4_1):
        head = 2 if kind == T.Q4_0 else 4
        blocks = raw.reshape(-1, head + 16)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)[:, 0]
        qs = blocks[:, head:]
        # ggml's order: the low nibbles are values 0-15 of the block, the high ones 16-31.
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1)
        if kind == T.Q4_0:
            zero = np.zeros_like(d)
        else:
            zero = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)[:, 0] + 8 * d
        scale = d
    elif kind == T.Q4_K:
        from gguf.quants import Q4_K

        blocks = raw.reshape(-1, 144)  # d, dmin (fp16), 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        sc, mn = Q4_K.get_scale_min(blocks[:, 4:16])
        scale = (d * sc.astype(np.float32)).reshape(-1)  # one per 32-value sub-block
        zero = (8 * d * sc.astype(np.float32) - dmin * mn.astype(np.float32)).reshape(-1)
        # Each 32 bytes hold two sub-blocks: the low nibbles the first, the high ones the second.
        qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        q = (qs & 0x0F).reshape(-1, GROUP)
    else:
        raise ValueError(f"GGML type {kind.name} is not a 4-bit group format")
    groups = cols // GROUP
    return Int4Values(torch.from_numpy(np.ascontiguousarray(q, dtype=np.uint8)).reshape(rows, cols),
                      torch.from_numpy(np.ascontiguousarray(scale, dtype=np.float32)).reshape(rows, groups),
                      torch.from_numpy(np.ascontiguousarray(zero, dtype=np.float32)).reshape(rows, groups))
