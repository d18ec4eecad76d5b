"""Quantized KV cache (kv_cache_dtype int8 / fp8): round trips, attention over quantized blocks on
the PyTorch path and the Triton kernels (interpreter), cache sizing, prefix caching, speculation,
and the engine end to end."""

from __future__ import annotations

import math
import os

import pytest
import torch

from localengine import LLM, SamplingParams
from localengine.kernels import kv_quant, reference
from localengine.kernels.kv_quant import FORMATS, KVStats, quantize, scales_for_layers
from tests.localengine.conftest import cached_tokens, make_llm
from tests.localengine.paged_batch import HEAD_DIM, build_batch

FORMAT_IDS = pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=list(FORMATS))
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def triton_or_skip():
    try:
        from localengine.kernels import triton_attention
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"triton is not usable here: {exc!r}")
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("triton needs CUDA or TRITON_INTERPRET=1 set before its first import")
    return triton_attention


def channel_gains(head_dim: int, seed: int) -> torch.Tensor:
    """Per-channel magnitudes as real keys have them: most near 1, a few outlier channels 8-12x."""
    g = torch.Generator().manual_seed(seed)
    gains = 0.5 + torch.rand(head_dim, generator=g)
    gains[torch.randperm(head_dim, generator=g)[:2]] = 8 + 4 * torch.rand(2, generator=g)
    return gains


def dequantize(stored: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return stored.float() * scale


def quantized_batch(specs, fmt: kv_quant.KVCacheFormat, **kwargs):
    """build_batch with outlier channels, its caches quantized with scales measured on their contents.
    Returns the float batch, the quantized caches and the layer's scales."""
    q, k, v, k_cache, v_cache, meta = build_batch(specs, **kwargs)
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    gk, gv = channel_gains(head_dim, 1), channel_gains(head_dim, 2)
    k, v, k_cache, v_cache = k * gk, v * gv, k_cache * gk, v_cache * gv
    stats = KVStats(1, kv_heads, head_dim, torch.device("cpu"))
    stats.observe(0, k_cache.flatten(0, 1), v_cache.flatten(0, 1))
    scales = scales_for_layers(stats.scales(fmt))[0]
    qk, qv = torch.zeros(k_cache.shape, dtype=fmt.dtype), torch.zeros(v_cache.shape, dtype=fmt.dtype)
    every_slot = torch.arange(k_cache.shape[0] * k_cache.shape[1])
    reference.store_kv_cache(k_cache.flatten(0, 1), v_cache.flatten(0, 1), qk, qv, every_slot, scales)
    return (q, k, v, k_cache, v_cache, meta), (qk, qv), scales


@FORMAT_IDS
def test_quantize_round_trip_error_bounds(fmt):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, 3, 32, generator=g) * channel_gains(32, 0)
    stats = KVStats(1, 3, 32, torch.device("cpu"))
    stats.observe(0, x, x)
    scale = stats.scales(fmt)[1, 0]  # values' scales: per-channel |max| with MARGIN
    stored = quantize(x, 1 / scale, fmt.dtype)
    assert stored.dtype == fmt.dtype and stored.element_size() == 1
    err = (dequantize(stored, scale) - x).abs()
    if fmt.name == "int8":
        assert bool((err <= scale / 2 * (1 + 1e-5)).all())  # half a step, everywhere in range
    else:  # e4m3: 3 mantissa bits, half an ulp relative; subnormals (below 2^-6) absolute 2^-10
        bound = torch.maximum(x.abs() * 2.0**-4, scale * 2.0**-10)
        assert bool((err <= bound * (1 + 1e-5)).all())
    # Nothing measured saturates (MARGIN); beyond the range, values saturate instead of wrapping or
    # turning into NaN.
    assert bool((stored.float().abs() < fmt.qmax).all())
    big = quantize(torch.full((1, 3, 32), 1e6), 1 / scale, fmt.dtype)
    assert bool((big.float() == fmt.qmax).all())


def test_key_bounds_hold_under_any_rotary_angle():
    """Keys are measured at a few positions but read at any: a rotation of each (i, i + d/2) pair
    must never push a value past its channel's bound (pair norms, not per-channel maxima)."""
    g = torch.Generator().manual_seed(3)
    k = torch.randn(64, 2, 16, generator=g) * channel_gains(16, 3)
    stats = KVStats(1, 2, 16, torch.device("cpu"))
    stats.observe(0, k, k)
    bound = stats.absmax[0, 0]
    for angle in torch.linspace(0, 2 * math.pi, 17):
        c, s = math.cos(angle), math.sin(angle)
        a, b = k[..., :8], k[..., 8:]
        rotated = torch.cat([a * c - b * s, b * c + a * s], dim=-1)
        assert bool((rotated.abs() <= bound * (1 + 1e-5)).all())


@FORMAT_IDS
def test_reference_attention_over_quantized_cache(fmt):
    """The quantized path computes exactly attention over the dequantized cache (scales folded into
    q and the output), and stays close to attention over the float cache."""
    specs = [(6, 1), (13, 1), (0, 1), (8, 9), (5, 3), (0, 20)]  # decodes, short queries, chunked and plain prefill
    (q, k, v, k_cache, v_cache, meta), (qk, qv), scales = quantized_batch(specs, fmt, heads=8, kv_heads=2)
    got = reference.paged_attention(q, k, v, qk, qv, meta, HEAD_DIM**-0.5, kv_scales=scales)
    # What the cache holds, in float: the fresh K/V of a plain prefill are read as stored too.
    dk, dv = dequantize(qk, scales.k), dequantize(qv, scales.v)
    fresh_k = dequantize(quantize(k, scales.k_inv, fmt.dtype), scales.k)
    fresh_v = dequantize(quantize(v, scales.v_inv, fmt.dtype), scales.v)
    exact = reference.paged_attention(q, fresh_k, fresh_v, dk, dv, meta, HEAD_DIM**-0.5)
    torch.testing.assert_close(got, exact, atol=2e-5, rtol=2e-5)
    float_out = reference.paged_attention(q, k, v, k_cache, v_cache, meta, HEAD_DIM**-0.5)
    relative = ((got - float_out).norm() / float_out.norm()).item()  # measured: 1.7% int8, 5.0% e4m3
    assert relative < (0.03 if fmt.name == "int8" else 0.08), relative


@FORMAT_IDS
def test_triton_store_matches_reference_bit_for_bit(fmt):
    """Including round-half cases, saturation and e4m3's subnormals and exponent carries (7.9 -> 8)."""
    triton_attention = triton_or_skip()
    g = torch.Generator().manual_seed(5)
    kv_heads, head_dim = 2, 12
    k = torch.randn(40, kv_heads, head_dim, generator=g) * 3
    v = torch.randn(40, kv_heads, head_dim, generator=g) * 3
    k[0, 0, :8] = torch.tensor([7.9, -7.9, 0.5, -0.5, 2.5, 1e6, -1e6, 3e-3])  # with scale 1: carries, ties, saturation
    v[1, 1, :4] = torch.tensor([2.0**-8, -(2.0**-9) * 3, 2.0**-11, 0.0])  # subnormal e4m3, underflow, zero
    scale = torch.ones(kv_heads, head_dim)
    scale[1] = 0.75
    scales = scales_for_layers(torch.stack([scale, scale])[:, None])[0]
    slots = torch.randperm(48, generator=g)[:40]
    ref_k, ref_v = torch.zeros(12, 4, kv_heads, head_dim, dtype=fmt.dtype), torch.zeros(12, 4, kv_heads, head_dim,
                                                                                          dtype=fmt.dtype)
    tri_k, tri_v = ref_k.clone(), ref_v.clone()
    reference.store_kv_cache(k, v, ref_k, ref_v, slots, scales)
    triton_attention.store_kv_cache(k, v, tri_k, tri_v, slots, scales)
    # Values, not bits: fp32's rounding trick on the Triton side turns -0.0 into +0.0.
    assert torch.equal(tri_k.float(), ref_k.float()) and torch.equal(tri_v.float(), ref_v.float())


@FORMAT_IDS
@pytest.mark.parametrize("num_splits", [1, 3])
def test_triton_attention_over_quantized_cache_matches_reference(fmt, num_splits):
    triton_attention = triton_or_skip()
    specs = [(6, 1), (37, 1), (0, 1), (8, 9), (0, 7)] if num_splits == 1 else [(6, 1), (37, 1), (70, 1)]
    (q, k, v, _, _, meta), (qk, qv), scales = quantized_batch(specs, fmt, num_blocks=48, heads=6, kv_heads=2)
    expected = reference.paged_attention(q, k, v, qk, qv, meta, HEAD_DIM**-0.5, kv_scales=scales)
    got = triton_attention.paged_attention(q, qk, qv, meta, HEAD_DIM**-0.5, num_splits=num_splits, kv_scales=scales)
    # On CPU the reference's int8 decode rows are the engine's op, which sums the stored values (up to 127)
    # before the scales: fp32 rounding a few times 1e-5 relative, in another order than Triton's.
    torch.testing.assert_close(got, expected, atol=5e-5, rtol=5e-5)


def test_kv_cache_dtype_names():
    assert kv_quant.kv_cache_format("fp8") == kv_quant.kv_cache_format("fp8_e4m3") == FORMATS["fp8_e4m3"]
    assert kv_quant.kv_cache_format("auto") is None


def test_unsupported_kv_cache_dtype_is_refused_by_name(llama_dir):
    with pytest.raises(NotImplementedError, match=r"fp8_e5m2.*int8"):
        make_llm(llama_dir, kv_cache_dtype="fp8_e5m2")


def test_same_memory_holds_twice_the_blocks(llama_dir):
    """Blocks sized from a byte budget: one byte per element, so twice bf16's blocks (no per-token
    scale bytes), and an int8/fp8 cache tensor."""
    budget = 300 * 1024  # 300 bf16 blocks of this model: 2 layers x 4 tokens x 2 heads x 16 dims x 2 (K, V) x 2 B
    counts = {}
    for kv in ("auto", "int8", "fp8"):
        runner = make_llm(llama_dir, dtype="bfloat16", kv_cache_dtype=kv, num_kvcache_blocks=None,
                          max_kv_cache_bytes=budget).llm_engine.model_runner
        counts[kv] = runner.num_kvcache_blocks
        assert runner.kv_cache.element_size() * runner.kv_cache.numel() <= budget
    assert counts == {"auto": 300, "int8": 600, "fp8": 600}


@pytest.fixture(scope="module", params=["int8", "fp8"])
def quantized_llm(request, llama_dir) -> LLM:
    return make_llm(llama_dir, kv_cache_dtype=request.param)


def test_engine_quantizes_its_cache(quantized_llm):
    runner = quantized_llm.llm_engine.model_runner
    assert runner.kv_cache.dtype == runner.kv_format.dtype
    for attn in runner.model.attention_layers():
        assert attn.kv_scales is not None and attn.observer is None
        assert bool((attn.kv_scales.k > 0).all()) and bool(torch.isfinite(attn.kv_scales.v_inv).all())


def test_prefix_cache_hit_on_quantized_blocks_gives_the_same_tokens(quantized_llm, llama_dir):
    prompt = list(range(3, 67))
    kv = quantized_llm.llm_engine.config.kv_cache_dtype
    cold = make_llm(llama_dir, kv_cache_dtype=kv, enable_prefix_caching=False).generate([prompt], GREEDY)[0]
    first = quantized_llm.generate([prompt], GREEDY)[0]
    again = quantized_llm.generate([prompt], GREEDY)[0]
    longer = quantized_llm.generate([prompt + [7, 8, 9, 10, 11]], GREEDY)[0]
    assert again.num_cached_tokens == 60 and longer.num_cached_tokens == 64
    assert first.outputs[0].token_ids == again.outputs[0].token_ids == cold.outputs[0].token_ids
    cold_longer = make_llm(llama_dir, kv_cache_dtype=kv, enable_prefix_caching=False).generate(
        [prompt + [7, 8, 9, 10, 11]], GREEDY)[0]
    assert longer.outputs[0].token_ids == cold_longer.outputs[0].token_ids


def test_cache_salt_still_isolates_quantized_blocks(quantized_llm):
    engine = quantized_llm.llm_engine
    prompt = list(range(100, 140))

    def cached(rid: str, salt: str) -> int:
        return cached_tokens(engine, rid, prompt, GREEDY, salt)

    assert cached("a1", "team-a") == 0
    assert cached("b1", "team-b") == 0
    assert cached("a2", "team-a") == 36


def test_batching_and_chunking_do_not_change_quantized_results(quantized_llm, llama_dir):
    prompts = [list(range(3, 3 + n)) for n in (5, 23, 40, 9)]
    kv = quantized_llm.llm_engine.config.kv_cache_dtype
    alone = [quantized_llm.generate([p], GREEDY)[0].outputs[0].token_ids for p in prompts]
    chunked = make_llm(llama_dir, kv_cache_dtype=kv, max_num_batched_tokens=16, enable_prefix_caching=False)
    assert [o.outputs[0].token_ids for o in chunked.generate(prompts, GREEDY)] == alone


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_engine_on_triton_backend_matches_torch_backend(llama_dir, kv):
    triton_or_skip()
    prompts = [list(range(5, 30)), [40, 41, 42]]
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    common = dict(dtype="float32", block_size=4, max_model_len=64, num_kvcache_blocks=32, device="cpu",
                  kv_cache_dtype=kv)
    tri = LLM(str(llama_dir), attention_backend="triton", **common).generate(prompts, params)
    ref = LLM(str(llama_dir), attention_backend="torch", **common).generate(prompts, params)
    assert [o.outputs[0].token_ids for o in tri] == [o.outputs[0].token_ids for o in ref]


@pytest.mark.parametrize("spec", [
    {"method": "ngram", "num_speculative_tokens": 4, "adaptive": False},
    {"method": "draft_model", "model": "demo-draft", "num_speculative_tokens": 3, "adaptive": False},
], ids=["ngram", "draft_model"])
def test_speculative_decoding_over_a_quantized_cache_keeps_greedy_output(spec):
    """The demo model end to end with an int8 cache: speculation (verification reads proposals'
    quantized K/V back from the cache) gives the tokens plain decoding gives, and the quantized
    cache's answers stay close to the float cache's."""
    prompts = ["def main(", "import os\nimport sys\n", "class Foo:\n    def __init__(self"]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    plain = LLM("demo", kv_cache_dtype="int8", max_model_len=512).generate(prompts, params)
    llm = LLM("demo", kv_cache_dtype="int8", max_model_len=512, speculative_config=spec)
    outs = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain]
    stats = llm.spec_decode_stats()
    assert stats is not None and stats.num_accepted_tokens > 0
    bm = llm.llm_engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_engine_serve_kv_cache_dtype(monkeypatch, capsys):
    """`slipstream engine serve --kv-cache-dtype int8` serves an engine over an int8 cache; a dtype it
    lacks is refused by name (exit 2) before anything listens."""
    import uvicorn

    from gateway.cli import main
    from localengine import server

    served = []
    monkeypatch.setattr(server, "create_app", lambda engine, *_: served.append(engine) or object())
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: None)
    assert main(["engine", "serve", "--model", "demo", "--kv-cache-dtype", "int8", "--max-model-len", "256"]) == 0
    assert served[0].engine.model_runner.kv_cache.dtype == torch.int8
    assert main(["engine", "serve", "--model", "demo", "--kv-cache-dtype", "fp8_e5m2"]) == 2
    assert "fp8_e5m2" in capsys.readouterr().err and len(served) == 1
