"""Greedy tokens and logprobs match Hugging Face transformers on tiny random models (fp32)."""

from __future__ import annotations

import pytest
import torch

from localengine import LLM, SamplingParams

PROMPTS = [[5, 17, 42, 99, 3, 250, 7], list(range(30, 70)), [11]]
NEW_TOKENS = 12


def hf_greedy(path, prompt: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    logprobs = []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            lp = model(ids).logits[0, -1].float().log_softmax(-1)
            logprobs.append(lp)
            ids = torch.cat([ids, lp.argmax().view(1, 1)], dim=1)
    return ids[0, len(prompt):].tolist(), logprobs


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_greedy_matches_transformers(model_dirs, model_type):
    path = model_dirs[model_type]
    llm = LLM(str(path), dtype="float32", block_size=4, max_model_len=256, max_num_seqs=8,
              num_kvcache_blocks=128)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=3)
    outs = llm.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        expected, hf_logprobs = hf_greedy(path, prompt)
        assert out.outputs[0].token_ids == expected
        for step, (ours, ref) in enumerate(zip(out.outputs[0].logprobs, hf_logprobs, strict=True)):
            for token_id, lp in ours.items():
                assert lp.logprob == pytest.approx(ref[token_id].item(), abs=1e-4), (step, token_id)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_runs_and_mostly_agrees(llama_dir, dtype):
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    common = dict(block_size=4, max_model_len=128, num_kvcache_blocks=32)
    half = LLM(str(llama_dir), dtype=dtype, **common).generate([PROMPTS[0]], params)[0].outputs[0].token_ids
    full = LLM(str(llama_dir), dtype="float32", **common).generate([PROMPTS[0]], params)[0].outputs[0].token_ids
    assert len(half) == 6 and half[0] == full[0]  # later tokens may drift on near-ties
