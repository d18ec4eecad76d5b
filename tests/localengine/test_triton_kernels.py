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

from localengine.kernels import reference  # noqa: E402
from localengine.layers.attention import AttentionMetadata  # noqa: E402

BLOCK = 4
KV_HEADS, HEADS, HEAD_DIM = 2, 4, 16


def build_batch(specs: list[tuple[int, int]], num_blocks: int = 40, seed: int = 0):
    """specs: (context already cached, new query tokens) per sequence, decodes (q=1) first."""
    g = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=g)
    v_cache = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=g)
    free = torch.randperm(num_blocks, generator=g).tolist()  # scattered, out-of-order blocks
    tables, slots, qs, ks, vs = [], [], [], [], []
    starts, seq_lens = [0], []
    for ctx, n in specs:
        seq_len = ctx + n
        table = [free.pop() for _ in range(-(-seq_len // BLOCK))]
        tables.append(table)
        k_full = torch.randn(seq_len, KV_HEADS, HEAD_DIM, generator=g)
        v_full = torch.randn(seq_len, KV_HEADS, HEAD_DIM, generator=g)
        pos = torch.arange(seq_len)
        all_slots = torch.tensor(table)[pos // BLOCK] * BLOCK + pos % BLOCK
        reference.store_kv_cache(k_full, v_full, k_cache, v_cache, all_slots)
        slots.append(all_slots[ctx:])
        ks.append(k_full[ctx:])
        vs.append(v_full[ctx:])
        qs.append(torch.randn(n, HEADS, HEAD_DIM, generator=g))
        starts.append(starts[-1] + n)
        seq_lens.append(seq_len)
    width = max(len(t) for t in tables)
    meta = AttentionMetadata(
        slot_mapping=torch.cat(slots),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        query_start_loc_cpu=starts,
        seq_lens_cpu=seq_lens,
        num_decodes=sum(1 for _, n in specs if n == 1),
        max_query_len=max(n for _, n in specs),
    )
    return torch.cat(qs), torch.cat(ks), torch.cat(vs), k_cache, v_cache, meta


@pytest.mark.parametrize(
    "specs",
    [
        [(6, 1), (13, 1), (0, 1)],  # decode only, partial last blocks
        [(0, 7), (0, 20)],  # prefill without cached prefix, query blocks > BLOCK_M
        [(5, 1), (8, 9), (3, 18)],  # mixed: decode + chunked prefill over cached prefixes
    ],
)
def test_paged_attention_matches_reference(specs):
    q, k, v, k_cache, v_cache, meta = build_batch(specs)
    expected = reference.paged_attention(q, k, v, k_cache, v_cache, meta, HEAD_DIM**-0.5)
    got = triton_attention.paged_attention(q, k_cache, v_cache, meta, HEAD_DIM**-0.5)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_store_kv_cache_matches_reference_with_non_power_of_two_width():
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(5, 2, 12, generator=g), torch.randn(5, 2, 12, generator=g)
    slots = torch.tensor([7, 0, 12, 3, 9])
    ref_k, ref_v = torch.zeros(4, BLOCK, 2, 12), torch.zeros(4, BLOCK, 2, 12)
    tri_k, tri_v = ref_k.clone(), ref_v.clone()
    reference.store_kv_cache(k, v, ref_k, ref_v, slots)
    triton_attention.store_kv_cache(k, v, tri_k, tri_v, slots)
    assert torch.equal(tri_k, ref_k) and torch.equal(tri_v, ref_v)


def test_engine_with_triton_backend_matches_torch_backend(llama_dir):
    from localengine import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    prompts = [[5, 6, 7, 8, 9, 10], [40, 41, 42]]
    common = dict(dtype="float32", block_size=4, max_model_len=64, num_kvcache_blocks=32, device="cpu")
    tri = LLM(str(llama_dir), attention_backend="triton", **common).generate(prompts, params)
    ref = LLM(str(llama_dir), attention_backend="torch", **common).generate(prompts, params)
    assert [o.outputs[0].token_ids for o in tri] == [o.outputs[0].token_ids for o in ref]
