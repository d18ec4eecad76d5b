"""Weight-only quantized matrices and their matmuls on CPU.

A decode step at batch 1 reads every weight once per token, so bytes per weight set its speed:
- `Int8Weight`: int8 values, one scale per output row (symmetric).
- int4: 4-bit values in groups of `group_size` along the input dimension, each group with a scale
  and a zero point (asymmetric), w = (q - 8) * scale + zero, q in [0, 15] (gpt-fast's and torchao's
  int4 format). GGUF's Q4_0, Q4_1 and Q4_K blocks are this format at group 32 (see
  models/gguf_quants.py), so they load without a float copy.

On CUDA, `Int4BlockWeight` and `Int8Weight` go to the engine's Triton kernels (kernels/triton_quantized.py):
decode rows read the quantized bytes in place, longer chunks dequantize once and take cuBLAS. PyTorch's
`_weight_int8pack_mm` on CUDA streamed 100 GB/s for a 4096 x 4096 weight at one row (bf16's F.linear:
1.8 TB/s) and took 18.8 ms at 512 rows (H200, bench/localengine/cuda_weights.py).

On CPU two kernels serve them. The engine's own (kernels/cpu_matmul.cpp, built on first use) takes up to
`cpu_ops.MAX_ROWS` rows of fp32 activations: int8 at memory speed, int4 as `Int4BlockWeight` with
activations quantized to int8 per 32 (llama.cpp's way). Longer chunks (prefill) dequantize the
layer's weight and run PyTorch's GEMM: bf16 on CPUs that multiply bf16 in hardware, else fp32.
Where the kernels cannot be built, PyTorch's own
`torch._weight_int8pack_mm` and `aten._weight_int4pack_mm_for_cpu` (`Int4Weight`, its packed layout)
serve every row count; their fast CPU paths take bf16 activations (int4 with fp32 activations falls
to a scalar loop, 30-50x slower on an AVX2 machine), so inputs are cast to bf16 and results back.
Scales and zeros are rounded to bf16 in both cases (8 bits of mantissa: a GGUF block's fp16 scale
moves by less than 0.4%, far under the 4-bit step itself), so both kernels hold the same weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from localengine.kernels import cpu_ops

ACTIVATION_DTYPE = torch.bfloat16
INT4_GROUP_SIZES = (32, 64, 128)
DEFAULT_INT4_GROUP_SIZE = 32  # GGUF's block size; see docs/localengine.md for 32 against 128


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(ACTIVATION_DTYPE).float()


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def _kernel_rows(flat: torch.Tensor) -> bool:
    """Whether the engine's kernels take these rows (and are built)."""
    return flat.shape[0] <= cpu_ops.MAX_ROWS and flat.device.type == "cpu" and cpu_ops.ops() is not None


def _fp32_rows(flat: torch.Tensor) -> torch.Tensor:
    return flat if flat.dtype == torch.float32 and flat.is_contiguous() else flat.float().contiguous()


def float_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight^T: the engine's kernel for up to `cpu_ops.MAX_ROWS` fp32 rows on CPU (MKL's sgemm
    reaches a third of the FMA units' rate at 4-16 rows; cpu_matmul.cpp `fp32_matmul`), else PyTorch's."""
    flat = _rows(x)
    if x.dtype == weight.dtype == torch.float32 and weight.is_contiguous() and _kernel_rows(flat):
        return _as_input(cpu_ops.built().fp32_matmul(flat.contiguous(), weight), x)
    return F.linear(x, weight)


def dequantized_linear(flat: torch.Tensor, dequantize: Callable[[], torch.Tensor]) -> torch.Tensor:
    """A long (prefill) chunk of rows against the layer's weight dequantized for this call: in bf16
    where the CPU multiplies bf16 in hardware (AMX: SmolLM2's prefill GEMMs 4x faster than fp32,
    docs/localengine.md), else in fp32. The weight is already 4 or 8 bits: bf16 activations cost
    the result far less than that."""
    if flat.device.type == "cpu" and cpu_ops.fast_bf16_gemm():
        return F.linear(flat.to(torch.bfloat16), dequantize().to(torch.bfloat16)).float()
    return F.linear(flat.float(), dequantize())


def _as_input(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """out [rows, N] back to x's dtype and leading shape."""
    out = out if out.dtype == x.dtype else out.to(x.dtype)
    return out if x.dim() == 2 else out.reshape(*x.shape[:-1], -1)


@dataclass(slots=True)
class Bf16Weight:
    """A float weight kept in bf16 and multiplied in fp32: the engine's op widens each value exactly
    (a bf16 value is the top half of an fp32 one), so the products are an fp32 copy's at half the
    bytes a decode step streams. From a bf16 checkpoint nothing is lost; from an fp32 one, each value
    is rounded to 8 bits of mantissa. Longer chunks (a prefill) take PyTorch's fp32 GEMM on an fp32
    copy made for the call."""

    weight: torch.Tensor  # bf16 [out, in]

    @classmethod
    def from_float(cls, w: torch.Tensor) -> Bf16Weight:
        return cls(w.detach().to(torch.bfloat16).contiguous())

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        flat = _rows(x)
        if _kernel_rows(flat):
            out = cpu_ops.built().fp32_matmul(_fp32_rows(flat), self.weight)
        else:  # in fp32 as well, not the bf16 GEMM the quantized formats' prefill takes on AMX: exact stays exact
            out = F.linear(flat.float(), self.dequantize())
        return _as_input(out, x)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows widened to `dtype` (an embedding lookup)."""
        return self.weight[ids].to(dtype)

    def dequantize(self) -> torch.Tensor:
        return self.weight.float()


@dataclass(slots=True)
class Int8Weight:
    qweight: torch.Tensor  # int8 [out, in]
    scales: torch.Tensor  # bf16 [out]
    scales_f32: torch.Tensor = field(init=False)  # the same values in fp32, for the engine's kernel

    def __post_init__(self) -> None:
        self.scales_f32 = self.scales.float()

    @classmethod
    def from_float(cls, w: torch.Tensor) -> Int8Weight:
        """Symmetric, round to nearest, one scale per row."""
        w = w.detach().float()
        # Rounded to the kernel's bf16 first, and the values to that scale: a value then moves by at
        # most half a step (rounding after would add up to 127 * 2^-9 of a step).
        scale = _bf16((w.abs().amax(dim=1) / 127).clamp(min=1e-30))
        q = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
        return cls(q, scale.to(ACTIVATION_DTYPE))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        flat = _rows(x)
        if flat.device.type == "cuda":
            from localengine.kernels.triton_quantized import int8_matmul  # triton only where there is a GPU

            out = int8_matmul(flat, self.qweight, self.scales_f32)
        elif self.qweight.shape[1] % 16 == 0 and _kernel_rows(flat):
            out = cpu_ops.built().int8_matmul(_fp32_rows(flat), self.qweight, self.scales_f32)
        elif flat.shape[0] > cpu_ops.MAX_ROWS and x.device.type == "cpu":
            out = dequantized_linear(flat, self.dequantize)
        else:
            out = torch._weight_int8pack_mm(flat.to(ACTIVATION_DTYPE), self.qweight, self.scales)
        return _as_input(out, x)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Dequantized rows (an embedding lookup)."""
        return self.qweight[ids].to(dtype) * self.scales[ids].to(dtype).unsqueeze(-1)

    def dequantize(self) -> torch.Tensor:
        return self.qweight.float() * self.scales_f32[:, None]


@dataclass(slots=True)
class Int4Values:
    """Unpacked 4-bit groups, w = (q - 8) * scale + zero: the form pieces of a fused layer are
    narrowed, permuted and concatenated in before packing."""

    q: torch.Tensor  # uint8 [out, in], values 0..15
    scale: torch.Tensor  # fp32 [out, in // group_size]
    zero: torch.Tensor  # fp32 [out, in // group_size]

    @property
    def group_size(self) -> int:
        return self.q.shape[1] // self.scale.shape[1]

    @classmethod
    def from_float(cls, w: torch.Tensor, group_size: int) -> Int4Values:
        """gpt-fast's asymmetric group quantization: scale = (max - min) / 15, zero = min + 8 scale."""
        rows, cols = w.shape
        g = w.detach().float().reshape(rows, cols // group_size, group_size)
        lo, hi = g.amin(dim=-1), g.amax(dim=-1)
        scale = _bf16(((hi - lo) / 15).clamp(min=1e-6))  # what the kernel will hold (see Int8Weight)
        zero = _bf16(lo + 8 * scale)
        q = ((g - zero[..., None]) / scale[..., None] + 8).round().clamp(0, 15).to(torch.uint8)
        return cls(q.reshape(rows, cols), scale, zero)

    def map_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Int4Values:
        """The same row operation (a narrow, a permutation) on values, scales and zeros."""
        return Int4Values(fn(self.q), fn(self.scale), fn(self.zero))

    def narrow_columns(self, start: int, length: int) -> Int4Values:
        g = self.group_size
        if start % g or length % g:
            raise ValueError(f"a tensor-parallel slice of {length} input features at {start} splits 4-bit groups of {g}")
        return Int4Values(self.q.narrow(1, start, length), self.scale.narrow(1, start // g, length // g),
                          self.zero.narrow(1, start // g, length // g))

    @staticmethod
    def cat(pieces: list[Int4Values]) -> Int4Values:
        return Int4Values(torch.cat([p.q for p in pieces]), torch.cat([p.scale for p in pieces]),
                          torch.cat([p.zero for p in pieces]))

    def dequantize(self) -> torch.Tensor:
        g = self.group_size
        q = self.q.float().reshape(self.q.shape[0], -1, g)
        return ((q - 8) * self.scale[..., None] + self.zero[..., None]).reshape(self.q.shape)


@dataclass(slots=True)
class Int4Weight:
    """PyTorch's own int4 kernel and packed layout (where the engine's kernels cannot be built)."""

    packed: torch.Tensor  # uint8 [out, in // 2], PyTorch's CPU int4 layout
    scales_and_zeros: torch.Tensor  # bf16 [in // group_size, out, 2]
    group_size: int
    in_features: int
    out_features: int

    @classmethod
    def from_values(cls, v: Int4Values) -> Int4Weight:
        rows = v.q.shape[0]
        pad = -rows % 16  # the packing works on 16 rows at a time: padded rows are zeros, sliced off
        if pad:
            v = Int4Values(torch.cat([v.q, v.q.new_full((pad, v.q.shape[1]), 8)]),
                           torch.cat([v.scale, v.scale.new_zeros(pad, v.scale.shape[1])]),
                           torch.cat([v.zero, v.zero.new_zeros(pad, v.zero.shape[1])]))
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(v.q.to(torch.int32).contiguous(), 1)
        sz = torch.stack([v.scale, v.zero], dim=-1).transpose(0, 1).contiguous().to(ACTIVATION_DTYPE)
        return cls(packed, sz, v.group_size, v.q.shape[1], rows)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(ACTIVATION_DTYPE)
        out: torch.Tensor = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, self.group_size, self.scales_and_zeros)
        if out.shape[1] != self.out_features:
            out = out[:, : self.out_features]
        return out.to(x.dtype).reshape(*x.shape[:-1], -1)


@dataclass(slots=True)
class Int4BlockWeight:
    """The engine's int4 kernel's layout: blocks of 32 inputs, 16 bytes each, byte j holding input j
    in its low nibble and input j + 16 in its high one (GGUF's Q4 order); w = q * scale + offset."""

    packed: torch.Tensor  # uint8 [out, in // 2]
    scale: torch.Tensor  # fp32 [out, in // group_size]
    offset: torch.Tensor  # fp32 [out, in // group_size]: zero - 8 * scale
    group_size: int

    @classmethod
    def from_values(cls, v: Int4Values) -> Int4BlockWeight:
        rows, cols = v.q.shape
        blocks = v.q.reshape(rows, cols // 32, 2, 16)
        packed = (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(rows, cols // 2).contiguous()
        scale = v.scale.to(ACTIVATION_DTYPE).float()  # the same bf16 values PyTorch's layout holds
        zero = v.zero.to(ACTIVATION_DTYPE).float()
        return cls(packed, scale.contiguous(), (zero - 8 * scale).contiguous(), v.group_size)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        flat = _rows(x)
        if flat.device.type == "cuda":
            from localengine.kernels.triton_quantized import int4_matmul  # triton only where there is a GPU

            out = int4_matmul(flat, self.packed, self.scale, self.offset, self.group_size)
        elif _kernel_rows(flat):
            out = cpu_ops.built().int4_matmul(_fp32_rows(flat), self.packed, self.scale, self.offset, self.group_size)
        else:
            out = dequantized_linear(flat, self.dequantize)
        return _as_input(out, x)

    def dequantize(self) -> torch.Tensor:
        """W as fp32 [out, in]: the CPU op where it is built, else the same unpacking in PyTorch ops."""
        if self.packed.device.type == "cpu" and cpu_ops.ops() is not None:
            return cpu_ops.built().int4_dequantize(self.packed, self.scale, self.offset, self.group_size)
        rows, half = self.packed.shape
        blocks = self.packed.reshape(rows, half // 16, 1, 16)
        q = torch.cat([blocks & 15, blocks >> 4], dim=2).reshape(rows, -1, self.group_size).float()
        return (q * self.scale[..., None] + self.offset[..., None]).reshape(rows, half * 2)


def int4_weight(v: Int4Values) -> Int4BlockWeight | Int4Weight:
    """The engine's layout where its kernels run (CUDA through Triton; CPU with AVX2), else PyTorch's
    (CPU only)."""
    if v.group_size in INT4_GROUP_SIZES and (v.q.device.type == "cuda" or cpu_ops.ops() is not None):
        return Int4BlockWeight.from_values(v)
    if v.q.device.type != "cpu":
        raise NotImplementedError(f"4-bit weights on {v.q.device.type} need groups of {INT4_GROUP_SIZES}, "
                                  f"not {v.group_size}")
    return Int4Weight.from_values(v)


QuantizedWeight = Bf16Weight | Int8Weight | Int4Weight | Int4BlockWeight
INT4_WEIGHT_TYPES = (Int4Weight, Int4BlockWeight)


def int4_group_size(in_features: int, preferred: int) -> int:
    """`preferred` when it divides the row, else the largest smaller size that does (SmolLM2's
    576-wide rows take 64, not 128)."""
    for g in sorted((s for s in INT4_GROUP_SIZES if s <= preferred), reverse=True):
        if in_features % g == 0:
            return g
    raise ValueError(f"no 4-bit group size of {INT4_GROUP_SIZES} up to {preferred} divides {in_features} input features")


def quantize(w: torch.Tensor, method: str, group_size: int = 32) -> QuantizedWeight:
    if method == "bf16":
        return Bf16Weight.from_float(w)
    if method == "int8":
        return Int8Weight.from_float(w)
    if method == "int4":
        return int4_weight(Int4Values.from_float(w, int4_group_size(w.shape[1], group_size)))
    raise ValueError(f"unknown weight quantization {method!r}")
