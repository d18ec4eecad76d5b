"""Triton kernels under TRITON_INTERPRET=1 (set in conftest before triton is imported) against the
PyTorch reference, on tiny fp32 shapes: the interpreter runs programs one by one in NumPy and has
no bf16 support."""

from __future__ import annotations

import os

import pytest
import torch

try:
    import triton  # noqa: F401

    from localengine.kernels import triton_attention
except Exception as exc:  # pragma: no cover - depends on the machine
    pytest.skip(f"triton is not usable here: {exc!r}", allow_module_level=True)

if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("triton needs CUDA or TRITON_INTERPRET=1 set before its first import", allow_module_level=True)

from localengine.kernels import reference
from tests.localengine.paged_batch import BLOCK, HEAD_DIM, build_batch


def assert_matches_reference(batch, num_splits: int | None, head_dim: int = HEAD_DIM) -> None:
    q, k, v, k_cache, v_cache, meta = batch
    expected = reference.paged_attention(q, k, v, k_cache, v_cache, meta, head_dim**-0.5)
    got = triton_attention.paged_attention(q, k_cache, v_cache, meta, head_dim**-0.5, num_splits=num_splits)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "specs",
    [
        [(6, 1), (13, 1), (0, 1)],  # decode only, partial last blocks
        [(0, 7), (0, 20)],  # prefill without cached prefix, query blocks > BLOCK_Q
        [(5, 1), (8, 9), (3, 18)],  # mixed: decode + chunked prefill over cached prefixes
    ],
)
def test_paged_attention_matches_reference(specs):
    assert_matches_reference(build_batch(specs), num_splits=1)


# Contexts of 1..71 positions: partial blocks, one and several 32-position tiles; with 4 segments
# of 32 the short ones leave later segments empty and 71 spans three.
DECODES = [(0, 1), (6, 1), (37, 1), (70, 1)]


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize(
    "heads, kv_heads",
    [(4, 4), (4, 2), (8, 2), (6, 2), (4, 1)],
    ids=["mha", "gqa2", "gqa4", "gqa3", "mqa"],
)
def test_grouped_heads_decode_matches_reference(heads, kv_heads, num_splits):
    batch = build_batch(DECODES, num_blocks=48, heads=heads, kv_heads=kv_heads)
    assert_matches_reference(batch, num_splits)


@pytest.mark.parametrize("block", [8, 16, 64])  # cache blocks smaller than, equal to, larger than a tile half
@pytest.mark.parametrize("num_splits", [1, 2])
def test_block_sizes_and_splits_match_reference(block, num_splits):
    specs = [(63, 1), (64, 1), (95, 1)]  # around tile and segment boundaries
    batch = build_batch(specs, num_blocks=3 * (96 // block + 1), block=block, heads=8, kv_heads=2, head_dim=12)
    assert_matches_reference(batch, num_splits, head_dim=12)


def test_split_with_multi_token_queries_matches_reference():
    """Forced splits over chunked prefill: a segment beyond a query's causal limit contributes nothing
    (rows that see no key in a segment must not turn into NaN)."""
    # Query block 2 of the last sequence (positions 30..33) reaches into the segment starting at 32.
    batch = build_batch([(5, 1), (8, 9), (22, 30)], num_blocks=40, heads=4, kv_heads=1)
    assert_matches_reference(batch, num_splits=3)


def test_split_heuristic():
    choose = triton_attention.choose_num_splits
    assert choose(1, 8, 1, 4096, sms=132) == 16  # batch-1 decode, long context: fill the SMs
    assert choose(1, 8, 1, 300, sms=132) == 2  # short context: segments of >= MIN_SPLIT_LEN
    assert choose(4, 8, 1, 4096, sms=132) == 4  # 32 programs: 4 segments each, power of two
    assert choose(32, 8, 1, 4096, sms=132) == 1  # the batch already fills the GPU
    assert choose(1, 8, 1, 100, sms=132) == 1  # nothing worth splitting
    assert choose(1, 8, 7, 4096, sms=132) == 1  # prefill and verification stay unsplit


def test_batch1_long_decode_splits_by_default_and_matches_reference():
    batch = build_batch([(299, 1)], num_blocks=80, heads=4, kv_heads=2)
    sms = triton_attention.num_sms(batch[0].device)
    assert triton_attention.choose_num_splits(1, 2, 1, 300, sms) == 2  # what paged_attention picks below
    assert_matches_reference(batch, num_splits=None)


def test_store_kv_cache_matches_reference_with_non_power_of_two_width():
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(5, 2, 12, generator=g), torch.randn(5, 2, 12, generator=g)
    slots = torch.tensor([7, 0, 12, 3, 9])
    ref_k, ref_v = torch.zeros(4, BLOCK, 2, 12), torch.zeros(4, BLOCK, 2, 12)
    tri_k, tri_v = ref_k.clone(), ref_v.clone()
    reference.store_kv_cache(k, v, ref_k, ref_v, slots)
    triton_attention.store_kv_cache(k, v, tri_k, tri_v, slots)
    assert torch.equal(tri_k, ref_k) and torch.equal(tri_v, ref_v)


def test_engine_with_triton_backend_matches_torch_backend(llama_dir, monkeypatch):
    from localengine import LLM, SamplingParams

    # Segments of >= 8 positions instead of 128, so that the decode steps here (2 sequences x 2 KV
    # heads, contexts up to 40) take the split-KV path without a long, slow interpreted prefill.
    monkeypatch.setattr(triton_attention, "MIN_SPLIT_LEN", 8)
    assert triton_attention.choose_num_splits(2, 2, 1, 38, triton_attention.num_sms(torch.device("cpu"))) == 4
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    prompts = [list(range(5, 42)), [40, 41, 42]]
    common = dict(dtype="float32", block_size=4, max_model_len=64, num_kvcache_blocks=32, device="cpu")
    tri = LLM(str(llama_dir), attention_backend="triton", **common).generate(prompts, params)
    ref = LLM(str(llama_dir), attention_backend="torch", **common).generate(prompts, params)
    assert [o.outputs[0].token_ids for o in tri] == [o.outputs[0].token_ids for o in ref]
