"""Speculative decoding: exact verification, greedy equality, rollback/abort hygiene, policy, metrics."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from localengine import LLM, SamplingParams
from localengine.spec_decode.ngram import NgramIndex, propose_ngram
from localengine.spec_decode.rejection_sampler import greedy_verify, greedy_verify_batch, rejection_sample

PROMPTS = ["def main(", "import os\nimport sys\n", "class Foo:\n    def __init__(self", "for i in range(10):\n"]
GREEDY = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "adaptive": False}
DRAFT = {"method": "draft_model", "model": "demo-draft", "num_speculative_tokens": 3, "adaptive": False}
MLP = {"method": "mlp_speculator", "model": "demo-speculator", "num_speculative_tokens": 4, "adaptive": False}
SPECS = pytest.mark.parametrize("spec", [NGRAM, DRAFT, MLP], ids=["ngram", "draft_model", "mlp_speculator"])


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


@pytest.mark.parametrize("one_hot", [False, True])
def test_rejection_sampler_preserves_target_distribution(one_hot):
    """Two proposals on a 5-token vocabulary: the joint law of the first two emitted tokens must
    be p1 x p2 (accepted, recovered and bonus paths all contribute), whatever q is."""
    g = torch.Generator().manual_seed(0)
    vocab, draws = 5, 20000
    p = torch.rand(3, vocab, generator=g) ** 3
    p /= p.sum(-1, keepdim=True)
    q = torch.rand(2, vocab, generator=g) ** 3
    q /= q.sum(-1, keepdim=True)
    counts = torch.zeros(vocab, vocab)
    for _ in range(draws):
        if one_hot:  # a deterministic proposer: always the same tokens, q = delta
            drafts, draft_probs = [1, 3], None
        else:
            drafts = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(2)]
            draft_probs = q
        out = rejection_sample(p, drafts, draft_probs, g)
        if len(out) == 1:  # rejected at once: the second token would come from the next step
            out.append(int(torch.multinomial(p[1], 1, generator=g)))
        counts[out[0], out[1]] += 1
    expected = p[0][:, None] * p[1][None, :]
    assert tv(counts / draws, expected) < 0.03


def test_rejection_sampler_accepts_identical_draft_and_rejects_impossible_token():
    g = torch.Generator().manual_seed(1)
    p = torch.tensor([[0.2, 0.8, 0.0], [0.5, 0.5, 0.0], [0.1, 0.1, 0.8]])
    out = rejection_sample(p, [1, 0], p[:2].clone(), g)
    assert out[:2] == [1, 0] and len(out) == 3  # p == q: always accepted, plus the bonus token
    for _ in range(50):
        assert rejection_sample(p, [2], None, g)[0] in (0, 1)  # p(2) = 0: never accepted


def test_greedy_verify():
    assert greedy_verify([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]  # all accepted + bonus
    assert greedy_verify([5, 6, 7, 8], [5, 9, 7]) == [5, 6]  # correction at the first mismatch
    assert greedy_verify([5, 6], [4]) == [5]


def test_greedy_verify_batch_mixes_proposal_counts():
    argmax = torch.tensor([5, 6, 7, 8] + [5, 6, 7, 8] + [5, 6])  # each request's k + 1 rows in turn
    assert greedy_verify_batch(argmax, [[5, 6, 7], [5, 9, 7], [4]]) == [[5, 6, 7, 8], [5, 6], [5]]


def test_ngram_proposer_matches_vllm_example():
    assert propose_ngram([1, 2, 3, 4, 2, 3], 2, 3, 4) == [4, 2, 3]
    assert propose_ngram([1, 2, 3, 4, 2, 3], 2, 3, 1) == [4]
    assert propose_ngram([1, 2, 3], 2, 3, 4) == []


def test_ngram_proposer_prefers_the_longest_then_the_latest_match():
    # "7 8 9" ends the context: the 3-gram at 4..6 wins over the earlier 2-gram "8 9" at 1..2.
    assert propose_ngram([8, 9, 1, 0, 7, 8, 9, 5, 6, 7, 8, 9], 2, 4, 2) == [5, 6]
    # Two equally long matches: the latest one's continuation.
    assert propose_ngram([4, 5, 1, 4, 5, 2, 4, 5], 2, 4, 1) == [2]
    # A repeating context follows its latest turn: "1 2" was followed by 3, now by 4.
    assert propose_ngram([1, 2, 3, 1, 2, 4, 1, 2], 2, 2, 2) == [4, 1]
    # A match may start at the first token; the suffix itself is never its own match.
    assert propose_ngram([3, 4, 3, 4], 2, 2, 3) == [3, 4]
    assert propose_ngram([3, 3, 3], 2, 4, 3) == [3]
    assert propose_ngram([1, 2, 3, 4], 1, 4, 2) == []
    assert propose_ngram([5, 6, 5], 1, 4, 2) == [6, 5]  # min 1: the last token alone
    assert propose_ngram([5, 6, 5], 2, 4, 2) == []


def _lookup_by_scanning(token_ids: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The definition, written as plainly as possible: the longest suffix n-gram that occurs earlier
    (followed by at least one token), its latest occurrence's continuation."""
    n_tokens = len(token_ids)
    for n in range(min(max_n, n_tokens - 1), min_n - 1, -1):
        suffix = token_ids[n_tokens - n :]
        for start in reversed(range(n_tokens - n)):
            if token_ids[start : start + n] == suffix:
                return token_ids[start + n : start + n + k]
    return []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=40), st.integers(1, 3), st.integers(0, 3), st.integers(0, 5),
       st.integers(0, 40))
def test_ngram_index_grown_step_by_step_is_the_scan(token_ids, min_n, extra_n, k, cut):
    """One request's index, fed its context as it grows (and once cut shorter, as if rolled back),
    proposes what a scan of the whole context does at every length."""
    index = NgramIndex()
    contexts = [token_ids[:end] for end in range(len(token_ids) + 1)] + [token_ids[:cut]]
    for context in contexts:
        assert index.propose(context, min_n, min_n + extra_n, k) == _lookup_by_scanning(context, min_n, min_n + extra_n, k)


@pytest.fixture(scope="module")
def base_llm():
    return LLM("demo")


@pytest.fixture(scope="module")
def reference(base_llm):
    return base_llm.generate(PROMPTS, GREEDY)


def assert_no_blocks_held(llm: LLM) -> None:
    engine = llm.llm_engine
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert all(b.ref_cnt == 0 for b in bm.blocks)
    draft = getattr(engine.proposer, "block_manager", None)
    if draft is not None:
        assert draft.num_free_blocks == draft.num_blocks and not engine.proposer.seqs


@SPECS
def test_greedy_output_unchanged_in_batch(base_llm, reference, spec):
    llm = LLM("demo", speculative_config=spec)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == [r.outputs[0].token_ids for r in reference]
    stats = llm.spec_decode_stats()
    assert stats is not None and stats.num_drafts > 0 and stats.num_accepted_tokens > 0
    assert stats.mean_acceptance_length == 1 + stats.num_accepted_tokens / stats.num_drafts
    assert sum(stats.num_accepted_tokens_per_pos) == stats.num_accepted_tokens
    assert_no_blocks_held(llm)
    text = llm.llm_engine.metrics.render().decode()
    for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total"):
        assert name in text
    # Continuing the generated texts hits blocks hashed during speculation: only verified tokens
    # may have been hashed, or the cached K/V would not match and the tokens would differ.
    longer = [r.prompt_token_ids + r.outputs[0].token_ids for r in reference]
    short = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    again = llm.generate(longer, short)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in base_llm.generate(longer, short)]
    # At least the two blocks every request filled while speculating (each prompt is under one
    # block); a third needs the K/V of token 47, which a last step that accepted past it never computes.
    assert all(o.num_cached_tokens >= 32 for o in again)


@pytest.mark.parametrize("spec", [DRAFT, MLP], ids=["draft_model", "mlp_speculator"])
def test_greedy_unchanged_under_preemption_chunking_and_stops(reference, spec):
    """A tiny cache (one max_model_len request fits) forces preemption mid-speculation; a small
    budget truncates proposals."""
    llm = LLM("demo", speculative_config=spec, num_kvcache_blocks=8, max_num_batched_tokens=16, max_model_len=96)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == [r.outputs[0].token_ids for r in reference]
    assert llm.llm_engine.scheduler.num_preemptions > 0
    assert_no_blocks_held(llm)
    # max_tokens is honoured exactly even when a verification accepts several tokens at once.
    short = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=7, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 7 for o in short)
    assert_no_blocks_held(llm)


@SPECS
def test_sampled_requests_and_abort_mid_speculation_free_everything(spec):
    llm = LLM("demo", speculative_config=spec)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.8, top_k=50, max_tokens=40, ignore_eos=True, seed=3)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", prompt, params)
    in_flight: list[str] = []
    for _ in range(30):
        engine.step()
        in_flight = [s.request_id for s in engine.scheduler.running if s.spec_token_ids]
        if in_flight:
            break
    assert in_flight  # abort requests whose proposals are waiting to be verified
    engine.abort_request(in_flight)
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    assert set(finished) == {f"r{i}" for i in range(4)} - set(in_flight)
    assert all(len(o.outputs[0].token_ids) == 40 for o in finished.values())
    assert_no_blocks_held(llm)


def test_adaptive_policy_switches_speculation_off():
    llm = LLM("demo", speculative_config={**NGRAM, "adaptive": True, "disable_by_batch_size": 3})
    llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    assert llm.spec_decode_stats().num_drafts == 0  # short outputs
    llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=60, ignore_eos=True))
    assert llm.spec_decode_stats().num_drafts == 0  # batch of 4 >= 3
    llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=80, ignore_eos=True))
    assert llm.spec_decode_stats().num_drafts > 0
    assert_no_blocks_held(llm)


def test_speculative_config_errors():
    with pytest.raises(ValueError, match="needs 'model'"):
        LLM("demo", speculative_config={"method": "draft_model", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="proposes at most 6 tokens"):
        LLM("demo", speculative_config={**MLP, "num_speculative_tokens": 7})
    with pytest.raises(ValueError, match="unknown"):
        LLM("demo", speculative_config={"method": "ngram", "num_speculative_tokens": 2, "bogus": 1})


def test_policy_adapts_k_and_stops_below_break_even():
    from localengine.config import SpeculativeConfig
    from localengine.engine.sequence import Sequence
    from localengine.spec_decode.policy import SpeculationPolicy

    policy = SpeculationPolicy(SpeculativeConfig("draft_model", 6, model="demo-draft"), 2048, draft_cost=0.2)
    seq = Sequence("a", [1, 2, 3], SamplingParams(max_tokens=200))
    start = policy.num_tokens(seq, batch_size=1)
    for _ in range(10):
        policy.observe("a", 6, 6)  # everything accepted: propose more
    assert policy.num_tokens(seq, 1) > start
    for _ in range(30):
        policy.observe("a", 2, 0)  # nothing accepted: below break-even
    assert policy.num_tokens(seq, 1) == 0 and policy.num_tokens(seq, 1) == 0  # off, cooling down
    assert policy.num_tokens(Sequence("b", [1], SamplingParams(max_tokens=200, logprobs=1)), 1) == 0


def test_one_preempted_cost_reading_does_not_switch_ngram_off():
    """On a shared machine a lookup can be descheduled for a time slice and measure as many target
    steps; the policy must keep speculating a request whose proposals are all accepted."""
    from localengine.config import SpeculativeConfig
    from localengine.engine.sequence import Sequence
    from localengine.spec_decode.policy import SpeculationPolicy

    policy = SpeculationPolicy(SpeculativeConfig("ngram", 4), 2048, draft_cost=0.0)
    seq = Sequence("a", [1, 2, 3], SamplingParams(max_tokens=500))
    for _ in range(5):
        policy.num_tokens(seq, 1)
        policy.observe_cost(0.01)
        policy.observe("a", 4, 4)
    policy.observe_cost(40.0)  # one lookup descheduled for 40 steps' time
    assert [policy.num_tokens(seq, 1) for _ in range(20)] == [4] * 20
    for _ in range(200):  # a proposer that really costs a step per token is still found out
        policy.observe_cost(1.0)
    assert policy.num_tokens(seq, 1) < 4


async def test_async_engine_streams_speculative_tokens(reference):
    from localengine import AsyncLLMEngine

    engine = AsyncLLMEngine.from_args("demo", speculative_config=DRAFT)
    try:
        seen = [out async for out in engine.generate(PROMPTS[0], GREEDY, "a1")]
        assert seen[-1].outputs[0].token_ids == reference[0].outputs[0].token_ids
        assert len(seen) < len(reference[0].outputs[0].token_ids)  # several tokens per step
        assert b"vllm:spec_decode_num_accepted_tokens_total" in engine.engine.metrics.render()
    finally:
        engine.shutdown()


def test_grouped_short_queries_match_per_sequence_attention(monkeypatch):
    """Verification batches (k + 1 queries over a cached prefix) take the grouped path."""
    from localengine.kernels import reference
    from localengine.layers.attention import AttentionMetadata

    g = torch.Generator().manual_seed(0)
    block, kv_heads, heads, dim = 4, 2, 4, 8
    k_cache = torch.randn(64, block, kv_heads, dim, generator=g)
    v_cache = torch.randn(64, block, kv_heads, dim, generator=g)
    specs = [(5, 1), (9, 4), (3, 4), (17, 2), (0, 6)]  # (cached context, new queries)
    free = torch.randperm(64, generator=g).tolist()
    tables, starts, seq_lens, slots = [], [0], [], []
    for ctx, n in specs:
        table = [free.pop() for _ in range(-(-(ctx + n) // block))]
        tables.append(table + [0] * (8 - len(table)))
        pos = torch.arange(ctx, ctx + n)
        slots.append(torch.tensor(table)[pos // block] * block + pos % block)
        starts.append(starts[-1] + n)
        seq_lens.append(ctx + n)
    total = starts[-1]
    q = torch.randn(total, heads, dim, generator=g)
    k = torch.randn(total, kv_heads, dim, generator=g)
    v = torch.randn(total, kv_heads, dim, generator=g)
    reference.store_kv_cache(k, v, k_cache, v_cache, torch.cat(slots))
    meta = AttentionMetadata(
        slot_mapping=torch.cat(slots), query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), block_tables=torch.tensor(tables, dtype=torch.int32),
        query_start_loc_cpu=starts, seq_lens_cpu=seq_lens, num_decodes=1, max_query_len=6,
    )
    grouped = reference.paged_attention(q, k, v, k_cache, v_cache, meta, dim**-0.5)
    monkeypatch.setattr(reference, "MAX_GROUPED_QUERY_LEN", 0)
    per_sequence = reference.paged_attention(q, k, v, k_cache, v_cache, meta, dim**-0.5)
    torch.testing.assert_close(grouped, per_sequence, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_draft_equal_to_target_accepts_everything(llama_dir, backend):
    """A draft identical to the target proposes the target's own argmax: every proposal is
    accepted. The triton case runs verification through the unified kernel (interpreter)."""
    if backend == "triton":
        pytest.importorskip("triton")
    common = {"dtype": "float32", "block_size": 4, "max_model_len": 64, "num_kvcache_blocks": 64, "device": "cpu",
              "attention_backend": backend}
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    prompts = [[5, 6, 7, 8, 9, 10], [40, 41, 42]]
    ref = LLM(str(llama_dir), **common).generate(prompts, params)
    spec = {"method": "draft_model", "model": str(llama_dir), "num_speculative_tokens": 3, "adaptive": False}
    llm = LLM(str(llama_dir), speculative_config=spec, **common)
    outs = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == [r.outputs[0].token_ids for r in ref]
    stats = llm.spec_decode_stats()
    assert stats.num_drafts > 0 and stats.acceptance_rate == 1.0
    if backend == "torch":
        # Sampled: q is the draft's (= the target's) distribution, so p / q = 1 up to rounding.
        llm.generate(prompts, SamplingParams(temperature=0.9, top_k=20, max_tokens=10, ignore_eos=True))
        assert stats.acceptance_rate > 0.99
    assert_no_blocks_held(llm)
