"""Linear layers whose checkpoint tensors arrive in pieces.

Hugging Face checkpoints store q/k/v and gate/up as separate matrices; one fused matmul is faster,
so the loader copies each piece into its slice of the fused weight (nano-vllm's
`packed_modules_mapping`, without tensor parallelism).
"""

from __future__ import annotations

import torch
from torch import nn


class MergedLinear(nn.Linear):
    def __init__(self, in_features: int, output_sizes: list[int], bias: bool):
        super().__init__(in_features, sum(output_sizes), bias=bias)
        self.output_sizes = output_sizes

    def load_shard(self, param_name: str, shard: int, tensor: torch.Tensor) -> None:
        start = sum(self.output_sizes[:shard])
        param = getattr(self, param_name)
        target = param.data.narrow(0, start, self.output_sizes[shard])
        if target.shape != tensor.shape:
            raise ValueError(f"checkpoint shard has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}")
        target.copy_(tensor)
