"""Tensor parallelism on CPU over gloo: TP=2 gives the tokens and logprobs of TP=1 (tiny Qwen2:
sharded q/k/v biases, GQA, untied vocab-parallel LM head); the workers stop with the engine; a
split the model cannot take fails before any process starts. (One model type: each TP engine
spawns a process that imports torch, the slow part of this test.)"""

from __future__ import annotations

import pytest

from localengine import LLM, SamplingParams

PROMPTS = [[5, 17, 42, 99, 3, 250, 7], list(range(30, 70))]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=2)
ARGS = dict(dtype="float32", block_size=4, max_model_len=128, max_num_seqs=4, num_kvcache_blocks=64)


def test_tp2_matches_tp1(model_dirs):
    path = str(model_dirs["qwen2"])
    single = LLM(path, **ARGS).generate(PROMPTS, GREEDY)
    llm = LLM(path, tensor_parallel_size=2, **ARGS)
    workers = llm.llm_engine.tp_workers.processes
    try:
        split = llm.generate(PROMPTS, GREEDY)
        again = llm.generate(PROMPTS[:1], GREEDY)  # the prefix cache hit path, shards in step
    finally:
        llm.shutdown()
    for one, two in zip(single, split, strict=True):
        assert two.outputs[0].token_ids == one.outputs[0].token_ids
        for a, b in zip(one.outputs[0].logprobs, two.outputs[0].logprobs, strict=True):
            for token, lp in a.items():
                assert b[token].logprob == pytest.approx(lp.logprob, abs=1e-4)
    assert again[0].outputs[0].token_ids == single[0].outputs[0].token_ids
    assert again[0].num_cached_tokens > 0
    assert workers and not any(p.is_alive() for p in workers)


def test_indivisible_split_is_refused_up_front(llama_dir):
    with pytest.raises(ValueError, match="tensor_parallel_size 3"):
        LLM(str(llama_dir), tensor_parallel_size=3, **ARGS)
