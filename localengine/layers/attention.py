"""Paged attention layer: write this step's K/V into cache slots, then attend over the cache.

The batch is flat (all scheduled tokens of all sequences back to back), ordered so that decode
sequences (one query token) come first; `AttentionMetadata` says where each sequence starts and
which cache blocks it owns. The backend is a PyTorch reference on CPU and Triton kernels on CUDA.
With a quantized cache (kv_cache_dtype int8/fp8) both backends quantize on store with the layer's
static scales and read the stored values back through them (kernels/kv_quant.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from localengine.kernels import reference
from localengine.kernels.kv_quant import KVScales


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] cache slot (block_id * block_size + offset) per token
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32: context length after this step, cached prefix included
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, padded with 0
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]
    num_decodes: int  # the first num_decodes sequences have exactly one query token
    max_query_len: int
    use_triton: bool = False
    workspace: reference.GatherWorkspace | None = None  # reused gather buffers (CPU path)
    # Per-step values every layer would otherwise recompute (CPU path: decode groups' gather ids
    # and masks), filled by the first layer that needs them.
    step_cache: dict[object, object] = field(default_factory=dict)


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        # Views into the engine's single KV allocation, set by the model runner.
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)
        # A quantized cache's scales (set by the model runner with the cache); None: K/V in the model's dtype.
        self.kv_scales: KVScales | None = None
        # Set only while the model runner measures those scales: sees every step's keys and values.
        self.observer: Callable[[torch.Tensor, torch.Tensor], None] | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        if self.observer is not None:
            self.observer(k, v)
        if meta.use_triton:
            from localengine.kernels import triton_attention

            triton_attention.store_kv_cache(k, v, self.k_cache, self.v_cache, meta.slot_mapping, self.kv_scales)
            return triton_attention.paged_attention(q, self.k_cache, self.v_cache, meta, self.scale,
                                                    kv_scales=self.kv_scales)
        reference.store_kv_cache(k, v, self.k_cache, self.v_cache, meta.slot_mapping, self.kv_scales)
        return reference.paged_attention(q, k, v, self.k_cache, self.v_cache, meta, self.scale, meta.workspace,
                                         self.kv_scales)
