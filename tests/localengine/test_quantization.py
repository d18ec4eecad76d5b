"""Weight-only quantization: int8 (one scale per output row) and int4 (groups with scales and zeros)
through the engine's CPU kernels (kernels/cpu_matmul.cpp) and, where those cannot be built, PyTorch's;
GGUF's 4-bit blocks kept as int4, and perplexity through the engine."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from localengine import SamplingParams
from localengine.kernels import cpu_ops
from localengine.layers.linear import ColumnParallelLinear, LinearBase, RowParallelLinear
from localengine.layers.quantization import (
    INT4_WEIGHT_TYPES,
    Bf16Weight,
    Int4BlockWeight,
    Int4Values,
    Int4Weight,
    Int8Weight,
    dequantized_linear,
    int4_weight,
)
from localengine.perplexity import perplexity
from tests.localengine.conftest import make_llm, ops_at_width

gguf = pytest.importorskip("gguf")


def _relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.float() - expected.float()).norm() / expected.float().norm()).item()


@pytest.mark.parametrize("rows", [1, 3, 5, 40])  # up to cpu_ops.MAX_ROWS: the kernel (tiles of 4 rows); more: a dequantized GEMM
def test_int8_linear_is_close_to_float(kernels, rows):
    torch.manual_seed(0)
    layer = ColumnParallelLinear(256, [128, 64], bias=True)
    with torch.no_grad():
        layer.weight.normal_(0, 0.1)
        assert layer.bias is not None
        layer.bias.normal_(0, 0.1)
    x = torch.randn(rows, 256)
    expected = layer(x)
    layer.quantize("int8")
    assert isinstance(layer.quant, Int8Weight) and layer.quant.qweight.dtype == torch.int8 and not hasattr(layer, "weight")
    got = layer(x)
    assert got.dtype == x.dtype and got.shape == expected.shape
    assert _relative_error(got, expected) < 0.02  # int8 weights, bf16 activations


@pytest.mark.parametrize("width", ["avx2", "avx512"])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 9, 17])  # 1 row x 4 features, 2 x 2, then AVX2 4 x 1, AVX-512 8 x 2
@pytest.mark.parametrize("features", [1, 6, 190, 333])  # remainders of the features a tile takes and of a thread's share
def test_int8_kernel_is_the_product_with_the_dequantized_rows(width, rows, features):
    """The engine's int8 kernel widens the weights to fp32 exactly: its product is x @ (q * scale)^T up
    to fp32 summation order, with two threads splitting the features."""
    torch.manual_seed(0)
    weight = Int8Weight.from_float(torch.randn(features, 96))
    x = torch.randn(rows, 96)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with ops_at_width(width):
            got = cpu_ops.ops().int8_matmul(x, weight.qweight, weight.scales_f32)
    finally:
        torch.set_num_threads(before)
    expected = (x.double() @ weight.dequantize().double().T).float()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("rows", "cols", "group"), [(96, 256, 32), (40, 192, 64), (8, 256, 128), (16, 96, 32)])  # 96: an odd block
@pytest.mark.parametrize("leading", [(1,), (3,), (2, 3), (5, 8)])  # up to 32 rows: the kernel; 40: dequantized
def test_int4_kernel_multiplies_by_the_dequantized_groups(kernels, rows, cols, group, leading):
    """The packed kernel computes x @ ((q - 8) * scale + zero)^T: the same as the unpacked groups'
    values up to bf16 (PyTorch's activations; scales and zeros in both) or int8 activations in
    blocks of 32 (the engine's kernel), and those are near the float weight."""
    torch.manual_seed(0)
    w = torch.randn(rows, cols)
    values = Int4Values.from_float(w, group)
    assert values.q.max() <= 15 and values.group_size == group
    reference = values.dequantize()
    assert _relative_error(reference, w) < 0.12  # 16 levels per group of Gaussian values
    packed = int4_weight(values)
    assert isinstance(packed, Int4BlockWeight if kernels == "engine" else Int4Weight)
    x = torch.randn(*leading, cols)  # any leading shape
    got = packed.matmul(x)
    assert got.shape == (*leading, rows) and got.dtype == torch.float32
    # The engine's int8 activations (llama.cpp's Q4 x Q8 way) move each value by up to half a step of
    # its block's largest / 127: 0.4-0.9% of these products, against 0.1-0.3% for bf16 activations.
    kernel_rows = kernels == "engine" and math.prod(leading) <= cpu_ops.MAX_ROWS
    assert _relative_error(got, x @ reference.T) < (0.015 if kernel_rows else 0.01)


@pytest.mark.parametrize("hardware_bf16", [False, True])
def test_a_prefill_chunk_multiplies_in_bf16_only_where_the_cpu_does_it_in_hardware(monkeypatch, hardware_bf16):
    """Long chunks run PyTorch's GEMM on the dequantized weight: in bf16 on CPUs with AMX or
    AVX512-BF16 (several times fp32's rate there), in fp32 elsewhere; either way fp32 comes back
    and stays near the exact product (bf16 rounds activations and weights by at most 2^-9)."""
    monkeypatch.setattr(cpu_ops, "fast_bf16_gemm", lambda: hardware_bf16)
    torch.manual_seed(0)
    x, w = torch.randn(64, 256), torch.randn(96, 256)
    seen: list[torch.dtype] = []

    def dequantize() -> torch.Tensor:
        seen.append(w.dtype)
        return w

    got = dequantized_linear(x, dequantize)
    assert got.dtype == torch.float32 and seen == [torch.float32]
    if hardware_bf16:
        assert torch.equal(got, (x.bfloat16() @ w.bfloat16().T).float())
        assert 0 < _relative_error(got, x @ w.T) < 0.01
    else:
        assert torch.equal(got, torch.nn.functional.linear(x, w))


@pytest.mark.parametrize(("rows", "cols", "group"), [(96, 256, 32), (40, 192, 64), (8, 256, 128), (17, 96, 32)])
def test_int4_blocks_dequantize_to_their_groups_values(rows, cols, group):
    """The engine's layout dequantized in one pass (prefill chunks) is exactly (q - 8) * scale + zero
    of the unpacked groups, with the bf16-rounded scales the layout holds."""
    if cpu_ops.ops() is None:
        pytest.skip("the engine's CPU kernels are not built here (no AVX2 or no compiler)")
    torch.manual_seed(0)
    values = Int4Values.from_float(torch.randn(rows, cols), group)
    blocks = Int4BlockWeight.from_values(values)
    expected = values.q.float().reshape(rows, -1, group) * blocks.scale[..., None] + blocks.offset[..., None]
    assert torch.equal(blocks.dequantize(), expected.reshape(rows, cols))


def _gguf_blocks(kind: str, rows: int, cols: int) -> np.ndarray:
    """Real blocks (gguf's own quantizer) or, for Q4_K (which gguf-py cannot quantize), random
    super-blocks: random nibbles and 6-bit scales, fp16 d and dmin of a realistic size."""
    qtype = gguf.GGMLQuantizationType[kind]
    rng = np.random.default_rng(0)
    if kind != "Q4_K":
        return gguf.quants.quantize(rng.normal(size=(rows, cols)).astype(np.float32), qtype)
    blocks = rng.integers(0, 256, size=(rows * cols // 256, 144), dtype=np.uint8)
    blocks[:, 0:2] = rng.uniform(1e-3, 2e-2, size=(len(blocks), 1)).astype(np.float16).view(np.uint8)
    blocks[:, 2:4] = rng.uniform(1e-3, 2e-2, size=(len(blocks), 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K"])
def test_gguf_4bit_blocks_map_onto_int4_groups(kind):
    """Value for value: (q - 8) * scale + zero over the mapped groups is what gguf's own dequantizer
    gives for the blocks (to fp32 rounding: the zero point folds the offset in)."""
    from localengine.models.gguf_quants import int4_values

    rows, cols = 6, 512
    qtype = gguf.GGMLQuantizationType[kind]
    blocks = _gguf_blocks(kind, rows, cols)
    reference = torch.from_numpy(gguf.quants.dequantize(blocks, qtype).astype(np.float32))
    values = int4_values(torch.from_numpy(blocks.copy()).reshape(-1), int(qtype), (rows, cols))
    assert values.group_size == 32 and values.q.dtype == torch.uint8 and int(values.q.max()) <= 15
    torch.testing.assert_close(values.dequantize(), reference, rtol=1e-6, atol=1e-6 * reference.abs().max().item())
    # Through the kernel: only the rounding of activations (int8 per 32 in the engine's kernel, bf16
    # in PyTorch's), scales and zeros is added.
    x = torch.randn(2, cols)
    assert _relative_error(int4_weight(values).matmul(x), x @ reference.T) < 0.015


def test_gguf_q8_0_requantized_per_row_stays_within_a_step():
    """Q8_0 (and other blocks of more than 4 bits) is dequantized exactly, then requantized to int8 with
    one scale per row: not exact, each value moves by at most half the row's step."""
    from localengine.models.gguf import dequantize

    qtype = gguf.GGMLQuantizationType.Q8_0
    blocks = _gguf_blocks("Q8_0", 16, 256)
    exact = dequantize(torch.from_numpy(blocks.copy()).reshape(-1), int(qtype), (16, 256))
    torch.testing.assert_close(exact, torch.from_numpy(gguf.quants.dequantize(blocks, qtype)), rtol=0, atol=0)
    int8 = Int8Weight.from_float(exact)
    step = exact.abs().amax(dim=1, keepdim=True) / 127
    assert ((int8.dequantize() - exact).abs() <= step * 0.51).all()  # the step: the bf16 scale, within 0.4%


def test_engine_runs_int8_and_int4(llama_dir):
    for method, kind in (("int8", (Int8Weight,)), ("int4", INT4_WEIGHT_TYPES)):
        llm = make_llm(llama_dir, quantization=method)
        model = llm.llm_engine.model_runner.model
        linears = [m for m in model.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
        assert linears and all(isinstance(m.quant, kind) for m in linears)
        # The embedding is int8 in both, the LM head (tied or not) too.
        assert isinstance(model.model.embed_tokens.quant, Int8Weight) and isinstance(model.lm_head.quant, Int8Weight)
        out = llm.generate(["def add(a, b):", [5, 6, 7]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        assert [len(o.outputs[0].token_ids) for o in out] == [8, 8]


def test_bf16_weights_give_an_fp32_copys_tokens_and_logprobs(llama_dir, tmp_path):
    """quantization="bf16" keeps the weights (linears, embedding, LM head) in bf16 and multiplies in fp32: on a checkpoint
    whose values are bf16 already, the tokens and log-probabilities are an fp32 engine's, bit for bit
    (decode rows widen each weight exactly; a prefill multiplies an fp32 copy), batched and long enough
    that the prompt goes through the prefill GEMM."""
    import shutil

    from safetensors.torch import load_file, save_file

    rounded = tmp_path / "bf16-valued"
    shutil.copytree(llama_dir, rounded)
    for file in rounded.glob("*.safetensors"):
        tensors = load_file(file)
        save_file({name: t.to(torch.bfloat16).float() if t.is_floating_point() else t for name, t in tensors.items()},
                  file, metadata={"format": "pt"})
    prompts = [_tiny_ids(40), [5, 6, 7], "def add(a, b):"]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    kept = make_llm(rounded, quantization="bf16")
    model = kept.llm_engine.model_runner.model
    linears = [m for m in model.modules() if isinstance(m, LinearBase)]
    assert linears and all(isinstance(m.quant, Bf16Weight) and m.quant.weight.dtype == torch.bfloat16 for m in linears)
    assert isinstance(model.model.embed_tokens.quant, Bf16Weight) and isinstance(model.lm_head.quant, Bf16Weight)
    got = kept.generate(prompts, params)
    expected = make_llm(rounded).generate(prompts, params)
    for g, e in zip(got, expected, strict=True):
        assert g.outputs[0].token_ids == e.outputs[0].token_ids
        assert g.outputs[0].logprobs == e.outputs[0].logprobs


def _tiny_ids(n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(1).integers(3, 300, size=n)]


def test_perplexity_is_transformers_own(llama_dir):
    """fp32 weights: the engine's sliding-window perplexity equals one computed from Hugging Face
    transformers' logits over the same windows, and so do its greedy choices at each position."""
    from transformers import AutoModelForCausalLM

    ids, window, stride = _tiny_ids(100), 48, 16
    hf = AutoModelForCausalLM.from_pretrained(str(llama_dir), dtype=torch.float32).eval()
    nll, count, start = 0.0, 0, 0
    argmax: list[int] = []
    while True:
        chunk = ids[start:start + window]
        first = 1 if start == 0 else window - stride
        with torch.inference_mode():
            logprobs = torch.log_softmax(hf(torch.tensor([chunk])).logits[0].float(), dim=-1)
        nll -= sum(logprobs[i - 1, chunk[i]].item() for i in range(first, len(chunk)))
        argmax += logprobs[first - 1 : len(chunk) - 1].argmax(dim=-1).tolist()
        count += len(chunk) - first
        if start + window >= len(ids):
            break
        start += stride
    got = perplexity(make_llm(llama_dir), ids, window=window, stride=stride)
    assert got.num_scored == count == len(ids) - 1
    assert got.perplexity == pytest.approx(math.exp(nll / count), rel=1e-4)
    assert list(got.argmax) == argmax


def test_gguf_blocks_load_kept_quantized(model_dirs, tmp_path):
    """A GGUF with Q4_0 / Q4_1 linears and a Q8_0 embedding: with `quantization="gguf"` the 4-bit
    linears are int4 weights packed from the file's blocks (no float copy), the embedding int8;
    `"none"` (and the default) dequantizes everything. Both score the same text nearly alike."""
    from tests.localengine.test_gguf import write_gguf

    hf_dir = model_dirs["llama"]
    cfg = json.loads((hf_dir / "config.json").read_text())
    path = write_gguf(hf_dir, tmp_path / "q4.gguf", "llama",
                      quantize={"attn_": "Q4_0", "ffn_": "Q4_1", "token_embd": "Q8_0"})
    kept = make_llm(path, quantization="gguf")
    model = kept.llm_engine.model_runner.model
    linears = [m for m in model.modules() if isinstance(m, LinearBase)]
    assert len(linears) == 4 * cfg["num_hidden_layers"] and all(isinstance(m.quant, INT4_WEIGHT_TYPES) for m in linears)
    assert not [n for n, _ in model.named_parameters() if "proj" in n]  # never given float storage
    assert isinstance(model.model.embed_tokens.quant, Int8Weight)
    plain = make_llm(path, quantization="none")
    assert plain.llm_engine.config.quantization is None and make_llm(path).llm_engine.config.quantization is None
    assert plain.llm_engine.model_runner.model.model.layers[0].mlp.gate_up_proj.quant is None
    ids = _tiny_ids(120)
    exact, quantized = perplexity(plain, ids, 64, 32), perplexity(kept, ids, 64, 32)
    assert quantized.perplexity == pytest.approx(exact.perplexity, rel=0.02)
    out = kept.generate(["def add(a, b):"], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 6


def test_gguf_quantization_needs_a_gguf_file(llama_dir):
    with pytest.raises(ValueError, match="GGUF"):
        make_llm(llama_dir, quantization="gguf")
