"""Weight-only int8 (`quantization="int8"`): int8 weights with one scale per output row, PyTorch's
int8 matmul."""

from __future__ import annotations

import torch

from localengine import SamplingParams
from localengine.layers.linear import ColumnParallelLinear, RowParallelLinear
from tests.localengine.conftest import make_llm


def test_int8_linear_is_close_to_float():
    torch.manual_seed(0)
    layer = ColumnParallelLinear(256, [128, 64], bias=True)
    with torch.no_grad():
        layer.weight.normal_(0, 0.1)
        assert layer.bias is not None
        layer.bias.normal_(0, 0.1)
    x = torch.randn(5, 256)
    expected = layer(x)
    layer.quantize_int8()
    assert layer.qweight is not None and layer.qweight.dtype == torch.int8 and not hasattr(layer, "weight")
    got = layer(x)
    assert got.dtype == x.dtype and got.shape == expected.shape
    assert ((got - expected).norm() / expected.norm()).item() < 0.02  # int8 weights, bf16 activations


def test_engine_runs_int8(llama_dir):
    llm = make_llm(llama_dir, quantization="int8")
    model = llm.llm_engine.model_runner.model
    linears = [m for m in model.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    assert linears and all(m.qweight is not None and m.qweight.dtype == torch.int8 for m in linears)
    out = llm.generate(["def add(a, b):", [5, 6, 7]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert [len(o.outputs[0].token_ids) for o in out] == [8, 8]
