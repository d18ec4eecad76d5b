"""Linear layers split across tensor-parallel ranks, and fused where checkpoints store pieces.

Megatron's split, as in nano-vllm and vLLM: a column-parallel layer keeps a slice of the output
features (no communication), a row-parallel layer a slice of the input features and all-reduces
its output; an attention or MLP block is column then row, so it costs one all-reduce. Hugging
Face checkpoints store q/k/v and gate/up as separate matrices; the fused layer takes each piece
with `weight_loader(param, tensor, shard)` and keeps this rank's slice of it. With tp_size 1
they are plain (fused) nn.Linear layers.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from localengine import distributed
from localengine.layers.quantization import (
    Bf16Weight,
    Int4BlockWeight,
    Int4Values,
    Int8Weight,
    QuantizedWeight,
    float_linear,
    int4_weight,
    quantize,
)


def _split(size: int, tp_size: int, what: str) -> int:
    if size % tp_size:
        raise ValueError(f"{what} ({size}) is not divisible by tensor_parallel_size {tp_size}")
    return size // tp_size


class LinearBase(nn.Module):
    """The matmul both parallel linears share: in float, or weight-only quantized (layers/quantization.py)
    once `quantize` ran or a checkpoint's 4-bit blocks were loaded (`load_int4`)."""

    weight: nn.Parameter
    bias: nn.Parameter | None
    tp_size: int
    quant: QuantizedWeight | None = None
    # Bumped whenever any layer's weight is replaced after loading, so what was derived from the
    # weights (models/llama.py FusedDecode) knows to remake itself with one comparison per step.
    weight_changes: ClassVar[int] = 0
    num_pieces = 1  # checkpoint tensors that make up the weight (fused layers: several)

    def __init__(self) -> None:
        super().__init__()
        self._int4_pieces: dict[int, Int4Values] = {}

    def quantize(self, method: str, group_size: int = 32) -> None:
        """Replace the float weight by `method`'s ("bf16", "int8", "int4"; vLLM's `quantization=`)."""
        self.set_quantized(quantize(self.weight, method, group_size))

    def set_quantized(self, weight: QuantizedWeight) -> None:
        LinearBase.weight_changes += 1
        self.quant = weight
        if "weight" in self._parameters:
            del self.weight

    def load_int4(self, values: Int4Values, shard: int = 0) -> bool:
        """Take one checkpoint piece already in 4-bit groups (a GGUF Q4 tensor); the layer packs its
        weight once every piece arrived, and says so."""
        self._int4_pieces[shard] = self._int4_slice(values, shard)
        if len(self._int4_pieces) < self.num_pieces:
            return False
        self.set_quantized(int4_weight(Int4Values.cat([self._int4_pieces[i] for i in range(self.num_pieces)])))
        self._int4_pieces.clear()
        return True

    def _int4_slice(self, values: Int4Values, shard: int) -> Int4Values:
        raise NotImplementedError

    def kernel_args(self) -> tuple[int, int, list[torch.Tensor]] | None:
        """The weight as the engine's fused decode layer takes it (kernels/cpu_ops.cpp `layer_linear`:
        kind, group size, tensors), or None where that op does not serve it (a bias, tensor
        parallelism, PyTorch's int4 layout, a float weight other than fp32)."""
        if self.bias is not None or self.tp_size > 1:
            return None
        q = self.quant
        if q is None:
            return (0, 0, [self.weight]) if self.weight.dtype == torch.float32 else None
        if isinstance(q, Bf16Weight):
            return 0, 0, [q.weight]  # the fp32 op takes bf16 weights
        if isinstance(q, Int8Weight) and q.qweight.shape[1] % 16 == 0:
            return 1, 0, [q.qweight, q.scales_f32]
        if isinstance(q, Int4BlockWeight):
            return 2, q.group_size, [q.packed, q.scale, q.offset]
        return None

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.quant is None:
            return float_linear(x, self.weight)
        return self.quant.matmul(x)


class ColumnParallelLinear(LinearBase):
    """y = x W^T + b with this rank's slice of each output piece (`output_sizes`, fused)."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool, tp_rank: int = 0, tp_size: int = 1):
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.output_sizes = [_split(s, tp_size, "output features") for s in output_sizes]
        self.num_pieces = len(output_sizes)
        self.weight = nn.Parameter(torch.empty(sum(self.output_sizes), in_features))
        self.bias = nn.Parameter(torch.empty(sum(self.output_sizes))) if bias else None

    def weight_loader(self, param: nn.Parameter, tensor: torch.Tensor, shard: int = 0) -> None:
        size = self.output_sizes[shard]
        target = param.data.narrow(0, sum(self.output_sizes[:shard]), size)
        piece = tensor.narrow(0, self.tp_rank * size, size) if tensor.shape[0] == size * self.tp_size else tensor
        if target.shape != piece.shape:
            raise ValueError(f"checkpoint piece has shape {tuple(tensor.shape)}, expected {size * self.tp_size} rows")
        target.copy_(piece)

    def _int4_slice(self, values: Int4Values, shard: int) -> Int4Values:
        size = self.output_sizes[shard]
        if values.q.shape[0] == size * self.tp_size and self.tp_size > 1:
            return values.map_rows(lambda t: t.narrow(0, self.tp_rank * size, size))
        if values.q.shape[0] != size:
            raise ValueError(f"checkpoint piece has {values.q.shape[0]} rows, expected {size * self.tp_size}")
        return values

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._matmul(x)
        return y + self.bias if self.bias is not None else y


class RowParallelLinear(LinearBase):
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

    def _int4_slice(self, values: Int4Values, shard: int) -> Int4Values:
        if self.tp_size > 1:
            values = values.narrow_columns(self.tp_rank * self.in_features, self.in_features)
        if values.q.shape[1] != self.in_features:
            raise ValueError(f"checkpoint tensor has {values.q.shape[1]} columns, expected {self.in_features}")
        return values

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._matmul(x)
        if self.tp_size > 1:
            distributed.all_reduce(y)
        return y + self.bias if self.bias is not None else y
