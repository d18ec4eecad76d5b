"""Linear layers split across tensor-parallel ranks, and fused where checkpoints store pieces.

Megatron's split, as in nano-vllm and vLLM: a column-parallel layer keeps a slice of the output
features (no communication), a row-parallel layer a slice of the input features and all-reduces
its output; an attention or MLP block is column then row, so it costs one all-reduce. Hugging
Face checkpoints store q/k/v and gate/up as separate matrices; the fused layer takes each piece
with `weight_loader(param, tensor, shard)` and keeps this rank's slice of it. With tp_size 1
they are plain (fused) nn.Linear layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from localengine import distributed


def _split(size: int, tp_size: int, what: str) -> int:
    if size % tp_size:
        raise ValueError(f"{what} ({size}) is not divisible by tensor_parallel_size {tp_size}")
    return size // tp_size


class _Linear(nn.Module):
    """The matmul both parallel linears share, in float or, after `quantize_int8`, weight-only int8."""

    weight: nn.Parameter
    qweight: torch.Tensor | None = None  # int8 [out, in], per-output-channel symmetric
    scales: torch.Tensor | None = None  # [out], bf16

    def quantize_int8(self) -> None:
        """Replace the float weight by int8 values and one scale per output row (weight-only, vLLM's
        `quantization="int8"`): a quarter of fp32's bytes read per token. The matmul is PyTorch's
        `_weight_int8pack_mm`, whose fast CPU kernel takes bf16 activations: inputs are cast to bf16
        for it and the result back to the model's dtype."""
        w = self.weight.detach().float()
        scale = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        self.qweight = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
        self.scales = scale.to(torch.bfloat16)
        del self.weight

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.qweight is None or self.scales is None:
            return F.linear(x, self.weight)
        flat = x.reshape(-1, x.shape[-1]).to(self.scales.dtype)
        return torch._weight_int8pack_mm(flat, self.qweight, self.scales).to(x.dtype).reshape(*x.shape[:-1], -1)


class ColumnParallelLinear(_Linear):
    """y = x W^T + b with this rank's slice of each output piece (`output_sizes`, fused)."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool, tp_rank: int = 0, tp_size: int = 1):
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.output_sizes = [_split(s, tp_size, "output features") for s in output_sizes]
        self.weight = nn.Parameter(torch.empty(sum(self.output_sizes), in_features))
        self.bias = nn.Parameter(torch.empty(sum(self.output_sizes))) if bias else None

    def weight_loader(self, param: nn.Parameter, tensor: torch.Tensor, shard: int = 0) -> None:
        size = self.output_sizes[shard]
        target = param.data.narrow(0, sum(self.output_sizes[:shard]), size)
        piece = tensor.narrow(0, self.tp_rank * size, size) if tensor.shape[0] == size * self.tp_size else tensor
        if target.shape != piece.shape:
            raise ValueError(f"checkpoint piece has shape {tuple(tensor.shape)}, expected {size * self.tp_size} rows")
        target.copy_(piece)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._matmul(x)
        return y + self.bias if self.bias is not None else y


class RowParallelLinear(_Linear):
    """y = all_reduce(x_slice W_slice^T) + b: this rank holds a slice of the input features."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp_rank: int = 0, tp_size: int = 1):
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.in_features = _split(in_features, tp_size, "input features")
        self.weight = nn.Parameter(torch.empty(out_features, self.in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def weight_loader(self, param: nn.Parameter, tensor: torch.Tensor, shard: int = 0) -> None:
        if param is self.weight:
            tensor = tensor.narrow(1, self.tp_rank * self.in_features, self.in_features)
        if param.shape != tensor.shape:
            raise ValueError(f"checkpoint tensor has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}")
        param.data.copy_(tensor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._matmul(x)
        if self.tp_size > 1:
            distributed.all_reduce(y)
        return y + self.bias if self.bias is not None else y
