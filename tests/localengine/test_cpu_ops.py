"""The engine's own CPU ops (kernels/cpu_ops.cpp) where they replace PyTorch's: the norms, the
rotary embedding, silu_and_mul and decode attention over the paged cache, each against the PyTorch
form it replaces, and the fp32 matmul for decode rows. The quantized matmuls are tested with the
weights they serve (test_quantization.py)."""

from __future__ import annotations

import shutil

import pytest
import torch

from localengine.kernels import cpu_ops
from localengine.layers.layernorm import RMSNorm
from tests.localengine.conftest import ops_at_width

needs_ops = pytest.mark.skipif("cpu_ops.ops() is None", reason="the engine's CPU ops are not built here")


def test_ops_are_built_where_they_can_be():
    """On an AVX2 machine with a C++ compiler the build must succeed: a broken build would otherwise
    pass unnoticed, every call quietly falling back to PyTorch's slower ops."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512") or not shutil.which("c++"):
        pytest.skip("no AVX2 or no C++ compiler: the engine uses PyTorch's ops")
    assert cpu_ops.ops() is not None


def _reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return (weight.double() * x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)).float()


@pytest.mark.parametrize("shape", [(1, 576), (5, 64), (3, 4, 20)])  # 20: a tail past the 8-wide vectors
def test_rms_norm(kernels, shape):
    torch.manual_seed(0)
    norm = RMSNorm(shape[-1], eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(shape) * 3
    torch.testing.assert_close(norm(x), _reference(x, norm.weight, 1e-5), rtol=1e-5, atol=1e-6)


def test_add_and_norm_carries_the_residual(kernels):
    torch.manual_seed(0)
    norm = RMSNorm(96)
    x, residual = torch.randn(4, 96), torch.randn(4, 96)
    expected_sum = x + residual
    expected = _reference(expected_sum, norm.weight, norm.eps)
    out, carried = norm.add_and_norm(x.clone(), residual.clone())
    torch.testing.assert_close(carried, expected_sum, rtol=0, atol=0)  # the sum itself is exact
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_bf16_keeps_pytorch_rounding(kernels):
    """Other dtypes never reach the fp32 ops: the output is rounded to bf16 before the weight's
    product, as Hugging Face's Llama does."""
    norm = RMSNorm(64).to(torch.bfloat16)
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    xf = x.float()
    expected = norm.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.eps)).to(torch.bfloat16)
    torch.testing.assert_close(norm(x), expected, rtol=0, atol=0)


def test_a_lock_left_by_a_killed_build_does_not_hang_the_next_start(tmp_path, monkeypatch):
    """PyTorch's extension builder waits while its lock file exists: one left by a build that was
    killed (a Ctrl-C during the first start) is removed at once by the next start, and one of a
    build still running (holding the build directory) is kept until that build ends."""
    import threading

    from filelock import FileLock

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    build = cpu_ops._build_dir()
    build.mkdir(parents=True)
    lock = build / "lock"
    lock.touch()  # a dead build's: nobody holds the directory
    with cpu_ops._building(build):
        assert not lock.exists()

    running = FileLock(build / "slipstream.lock")  # a build in another start, with its PyTorch lock
    running.acquire()
    lock.touch()
    entered = threading.Event()

    def start() -> None:
        with cpu_ops._building(build):
            entered.set()

    second = threading.Thread(target=start)
    second.start()
    assert not entered.wait(0.5) and lock.exists()  # it waits for the running build, its lock kept
    lock.unlink()  # the running build ends
    running.release()
    assert entered.wait(30)
    second.join()


@pytest.mark.parametrize("head_dim", [64, 20])
def test_rotary_matches_the_pytorch_form_in_place(kernels, head_dim):
    """Bit for bit (the same products and sums), in place on q and k as views into the fused
    projection's output, leaving v alone."""
    from localengine.layers.rotary_embedding import RotaryEmbedding, apply_rotary

    torch.manual_seed(0)
    rope = RotaryEmbedding(head_dim, 10000.0)
    rope.build(512, torch.device("cpu"))
    cos, sin = rope(torch.tensor([0, 7, 300]))
    qkv = torch.randn(3, 6 * head_dim)
    qk = qkv[:, : 5 * head_dim].view(3, 5, head_dim)
    xf = qk.clone()
    x1, x2 = xf.chunk(2, dim=-1)
    expected = xf * cos + torch.cat([-x2, x1], dim=-1) * sin
    v_before = qkv[:, 5 * head_dim :].clone()
    got = apply_rotary(qk, cos, sin)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(qkv[:, 5 * head_dim :], v_before, rtol=0, atol=0)


@needs_ops
def test_silu_and_mul():
    import torch.nn.functional as F

    torch.manual_seed(0)
    x = torch.randn(5, 2 * 96) * 6  # large gates: both tails of the exponential
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(cpu_ops.ops().silu_and_mul(x), F.silu(gate) * up, rtol=2e-6, atol=1e-6)


@pytest.fixture(params=["pytorch", "avx2", "avx512"])
def matmul_kernels(request, monkeypatch):
    """PyTorch's matmul (as where the engine's ops cannot be built), or the engine's fp32 op in either
    of its forms."""
    if request.param == "pytorch":
        monkeypatch.setattr(cpu_ops, "ops", lambda: None)
        yield request.param
        return
    with ops_at_width(request.param):
        yield request.param


@pytest.mark.parametrize("rows", [1, 3, 5, 6, 9, 17, 32])  # AVX2: tiles of up to 4 rows; AVX-512: up to 8; up to MAX_ROWS
@pytest.mark.parametrize(("features", "inputs"), [(7, 20), (96, 576), (3, 1536)])  # 7, 20: tails of 3 features, 8 and 16 inputs
def test_fp32_linear_for_few_rows(matmul_kernels, rows, features, inputs):
    """Decode-sized rows of fp32 go through the engine's kernel (float_linear), more through PyTorch's."""
    from localengine.layers.quantization import float_linear

    torch.manual_seed(0)
    x, w = torch.randn(rows, inputs), torch.randn(features, inputs)
    expected = (x.double() @ w.double().T).float()
    torch.testing.assert_close(float_linear(x, w), expected, rtol=1e-4, atol=1e-4 * inputs ** 0.5)
    torch.testing.assert_close(float_linear(x.view(1, rows, inputs), w), expected.view(1, rows, features),
                               rtol=1e-4, atol=1e-4 * inputs ** 0.5)


@pytest.mark.parametrize("width", ["avx2", "avx512"])
@pytest.mark.parametrize("rows", [1, 3, 9, 17])
@pytest.mark.parametrize(("features", "inputs"), [(7, 20), (96, 576), (3, 1536)])
def test_bf16_weights_multiply_as_their_fp32_copy(width, rows, features, inputs):
    """The fp32 op widens a bf16 weight exactly: the same output, bit for bit, as the fp32 copy gives."""
    torch.manual_seed(0)
    x, w = torch.randn(rows, inputs), torch.randn(features, inputs).to(torch.bfloat16)
    with ops_at_width(width):
        torch.testing.assert_close(cpu_ops.ops().fp32_matmul(x, w), cpu_ops.ops().fp32_matmul(x, w.float()), rtol=0, atol=0)


@needs_ops
@pytest.mark.parametrize("cache", ["fp32", "int8", "fp8"])
@pytest.mark.parametrize("lens", [[1], [17, 33, 5], [64]])
def test_decode_attention_reads_the_paged_cache_in_place(lens, cache):
    """Against SDPA over the gathered blocks (the reference path), for GQA groups of 3, contexts
    shorter than a block, ending mid-block and spanning scattered blocks of a shared pool; an int8
    or fp8 (e4m3fn: subnormals, zeros of both signs and the saturation value included) cache's stored
    values read as they are (its scales are the caller's)."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    block_size, kv_heads, heads, d = 4, 3, 9, 64
    shape = (40, block_size, kv_heads, d)
    if cache == "int8":
        k_cache, v_cache = torch.randint(-127, 128, shape, dtype=torch.int8), torch.randint(-127, 128, shape, dtype=torch.int8)
        q, tolerance = torch.randn(len(lens), heads, d) / 64, 1e-4  # scores of the size real scales give
    elif cache == "fp8":
        every = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
        finite = every[~every.float().isnan()]  # all 254 e4m3fn values but NaN (a store saturates before it)
        k_cache, v_cache = (finite[torch.randint(0, finite.numel(), shape)] for _ in range(2))
        q, tolerance = torch.randn(len(lens), heads, d) / 448, 1e-4
    else:
        k_cache, v_cache = torch.randn(shape), torch.randn(shape)
        q, tolerance = torch.randn(len(lens), heads, d), 1e-5
    tables = torch.stack([torch.randperm(40)[:16] for _ in lens]).to(torch.int32)
    got = cpu_ops.ops().paged_attention_decode(q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32), d**-0.5)
    for s, n in enumerate(lens):
        ids = tables[s, : -(-n // block_size)].long()
        keys = k_cache[ids].reshape(-1, kv_heads, d)[:n].transpose(0, 1).float()
        values = v_cache[ids].reshape(-1, kv_heads, d)[:n].transpose(0, 1).float()
        expected = F.scaled_dot_product_attention(q[s].unsqueeze(1), keys, values, scale=d**-0.5, enable_gqa=True)
        torch.testing.assert_close(got[s], expected.squeeze(1), rtol=tolerance, atol=tolerance)


@needs_ops
@pytest.mark.parametrize(("quantization", "kv_cache_dtype"), [("none", "auto"), ("int8", "auto"), ("int4", "auto"),
                                                              ("none", "int8"), ("none", "fp8")])
def test_fused_decode_layer_is_the_layer(llama_dir, monkeypatch, quantization, kv_cache_dtype):
    """A decode step's layers as one op each (`decode_layer`) give the tokens and log-probabilities of
    the layer-by-layer path, for float, int8 and int4 weights and an int8 or fp8 KV cache (stored through
    its scales as the layer stores it), batched decodes of different lengths; the op ran (counted), and a
    prefill never takes it."""
    from localengine import SamplingParams
    from localengine.models.llama import LlamaDecoderLayer
    from tests.localengine.conftest import make_llm

    calls = {"fused": 0}
    original = LlamaDecoderLayer.fused_decode

    def counted(self, *args):
        out = original(self, *args)
        calls["fused"] += out is not None
        return out

    prompts = ["def add(a, b):", "The quick brown fox", [5, 6, 7, 8, 9, 10, 11]]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)

    def run():
        llm = make_llm(llama_dir, quantization=quantization, kv_cache_dtype=kv_cache_dtype)
        return [(o.outputs[0].token_ids, [next(iter(lp.values())).logprob for lp in o.outputs[0].logprobs or []])
                for o in llm.generate(prompts, params)]

    monkeypatch.setattr(LlamaDecoderLayer, "fused_decode", counted)
    fused = run()
    layers = 2
    assert calls["fused"] == layers * 11  # every decode step (11 after each prompt's first token), no prefill
    monkeypatch.setattr(LlamaDecoderLayer, "fused_decode", lambda self, *args: None)
    reference = run()
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(fused, reference, strict=True):
        assert tokens == ref_tokens
        torch.testing.assert_close(torch.tensor(logprobs), torch.tensor(ref_logprobs), rtol=1e-4, atol=1e-4)


@needs_ops
def test_fused_decode_follows_weights_quantized_after_loading(llama_dir):
    """Weights replaced after the first steps (quantized in place, as `smollm2.py --int8-side-by-side`
    does) are the ones the fused layer uses next: the same tokens as an engine loaded as int8."""
    from localengine import SamplingParams
    from localengine.models.loader import quantization_plan, quantize_loaded
    from tests.localengine.conftest import make_llm

    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    llm = make_llm(llama_dir)
    llm.generate(["def add(a, b):"], params)  # the fused layers are set up with the fp32 weights
    model = llm.llm_engine.model_runner.model
    quantize_loaded(model, quantization_plan(model, llm.llm_engine.config.model_path, "int8"))
    again = llm.generate(["The quick brown fox"], params)[0].outputs[0].token_ids
    assert again == make_llm(llama_dir, quantization="int8").generate(["The quick brown fox"], params)[0].outputs[0].token_ids
