"""The CUDA path's weight-only matmuls (kernels/triton_quantized.py) under TRITON_INTERPRET=1
(tests/localengine's conftest sets it before triton is imported): the product with the dequantized
weight for decode rows (the split-K kernels) and longer chunks (dequantized once), every int4 group
size, rows and features that fill no tile, GGUF's Q4 blocks as loaded, and int8. bf16 runs on a GPU
only (tests/gpu): the interpreter's `tl.dot` miscomputes bf16 operands."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from localengine.layers.quantization import Int4BlockWeight, Int4Values, Int8Weight

if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("triton needs CUDA or TRITON_INTERPRET=1 set before its first import", allow_module_level=True)

from localengine.kernels.triton_quantized import int4_matmul, int8_matmul


def _weight(out_features: int, in_features: int, group_size: int) -> tuple[Int4Values, Int4BlockWeight]:
    values = Int4Values.from_float(torch.randn(out_features, in_features), group_size)
    return values, Int4BlockWeight.from_values(values)


@pytest.mark.parametrize(("rows", "out_features", "in_features", "group_size"), [
    (1, 48, 64, 32),  # a decode row
    (3, 40, 96, 32),  # a verification step; K cut into three segments
    (16, 70, 128, 64),  # a full 16-row tile, features past one 64-wide tile
    (5, 24, 256, 128),  # groups of four blocks
    (17, 33, 128, 64),  # past the decode rows: dequantized once, then one matmul
])
def test_int4_kernel_is_the_product_with_the_dequantized_weight(rows, out_features, in_features, group_size):
    torch.manual_seed(0)
    values, weight = _weight(out_features, in_features, group_size)
    x = torch.randn(rows, in_features)
    reference = x @ values.dequantize().T
    got = int4_matmul(x, weight.packed, weight.scale, weight.offset, group_size)
    assert got.dtype == torch.float32 and got.shape == (rows, out_features)
    torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-4)  # fp32 in IEEE: summation order only
    half = int4_matmul(x.half(), weight.packed, weight.scale, weight.offset, group_size)
    assert half.dtype == torch.float16
    assert ((half.float() - reference).norm() / reference.norm()).item() < 2e-3  # fp16 operands


def test_the_layer_takes_the_kernel_on_cuda_and_its_unpacking_elsewhere():
    """`Int4BlockWeight.dequantize` without the CPU op (a GPU's tensors) unpacks the same bytes."""
    torch.manual_seed(1)
    values, weight = _weight(24, 160, 32)
    torch.testing.assert_close(Int4BlockWeight.dequantize(weight), values.dequantize())
    on_meta = Int4BlockWeight(weight.packed.to("meta"), weight.scale.to("meta"), weight.offset.to("meta"), 32)
    assert on_meta.dequantize().shape == (24, 160)  # the PyTorch-ops unpacking, not the CPU op


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_gguf_blocks_through_the_kernel(kind):
    gguf = pytest.importorskip("gguf")
    from localengine.models.gguf_quants import int4_values

    rows, cols = 20, 128
    qtype = gguf.GGMLQuantizationType[kind]
    blocks = gguf.quants.quantize(np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32), qtype)
    reference = torch.from_numpy(gguf.quants.dequantize(blocks, qtype).astype(np.float32))
    weight = Int4BlockWeight.from_values(int4_values(torch.from_numpy(blocks.copy()).reshape(-1), int(qtype), (rows, cols)))
    x = torch.randn(2, cols)
    got = int4_matmul(x, weight.packed, weight.scale, weight.offset, weight.group_size)
    # Only the scales' rounding to bf16 (as on CPU) separates the two.
    assert ((got - x @ reference.T).norm() / (x @ reference.T).norm()).item() < 5e-3


def test_rows_the_weight_does_not_take_are_refused():
    _, weight = _weight(8, 64, 32)
    with pytest.raises(ValueError, match="does not take rows of 96"):
        int4_matmul(torch.randn(1, 96), weight.packed, weight.scale, weight.offset, 32)


@pytest.mark.parametrize(("rows", "out_features", "in_features"), [(1, 48, 64), (4, 70, 100), (17, 20, 64)])
def test_int8_kernel_is_the_product_with_the_dequantized_weight(rows, out_features, in_features):
    """K need not be a multiple of the kernel's 32-input steps (the CPU kernel asks 16)."""
    torch.manual_seed(2)
    weight = Int8Weight.from_float(torch.randn(out_features, in_features))
    x = torch.randn(rows, in_features)
    reference = x @ weight.dequantize().T
    torch.testing.assert_close(int8_matmul(x, weight.qweight, weight.scales_f32), reference, rtol=1e-5, atol=1e-4)
