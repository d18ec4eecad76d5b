"""Review defects, each pinned: min_tokens vs stop strings, raw logprobs, all-or-nothing generate(),
a KV cache too small for one request, Llama's o_proj bias, penalties and logit bias, refused features."""

from __future__ import annotations

import pytest
import torch

from localengine import LLM, SamplingParams
from localengine.engine.sequence import Sequence
from localengine.layers.sampler import apply_penalties
from localengine.serving_chat import ChatRequestError, parse_chat_request
from tests.localengine.conftest import make_llm

PROMPT = list(range(3, 20))


@pytest.fixture(scope="module")
def llm(llama_dir) -> LLM:
    return make_llm(llama_dir)


def test_stop_strings_wait_for_min_tokens(llm):
    base = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    out = llm.generate([PROMPT], base)[0].outputs[0]
    tokenizer = llm.get_tokenizer()
    head = tokenizer.decode(out.token_ids[:6])
    stop = head[1:3]  # completes inside the first 6 tokens
    assert stop and stop in out.text
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, min_tokens=6, stop=[stop])
    held = llm.generate([PROMPT], params)[0].outputs[0]
    assert held.token_ids[:6] == out.token_ids[:6]
    assert held.text.startswith(head), "text of the first min_tokens tokens must not be cut by a stop string"
    assert held.text == tokenizer.decode(held.token_ids)[: len(held.text)]


def test_logprobs_come_from_the_raw_distribution(llm):
    probe = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=1, logprobs=3, ignore_eos=True))[0]
    entry = probe.outputs[0].logprobs[0]
    chosen = probe.outputs[0].token_ids[0]
    runner_up = next(t for t, lp in sorted(entry.items(), key=lambda x: x[1].rank) if t != chosen)
    banned = SamplingParams(temperature=0, max_tokens=1, logprobs=0, min_tokens=1, stop_token_ids=[runner_up])
    out = llm.generate([PROMPT], banned)[0].outputs[0]
    assert out.token_ids == [chosen]
    assert out.logprobs[0][chosen].logprob == pytest.approx(entry[chosen].logprob, abs=1e-5)


def test_a_rejected_prompt_leaves_nothing_queued(llm):
    good = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    with pytest.raises(ValueError):
        llm.generate([PROMPT, [10**9]], good)
    assert not llm.llm_engine.has_unfinished_requests()
    assert len(llm.generate([PROMPT], good)) == 1


def test_a_cache_too_small_for_one_request_fails_at_start(llama_dir):
    with pytest.raises(MemoryError, match="max_model_len"):
        make_llm(llama_dir, max_model_len=64, num_kvcache_blocks=8)  # 64 tokens need 16 blocks of 4
    make_llm(llama_dir, max_model_len=64, num_kvcache_blocks=16)
    spec = {"method": "ngram", "num_speculative_tokens": 4}
    with pytest.raises(MemoryError, match="speculative"):
        make_llm(llama_dir, max_model_len=64, num_kvcache_blocks=16, speculative_config=spec)


def test_llama_attention_bias_covers_o_proj(tmp_path):
    from transformers import AutoModelForCausalLM

    from tests.localengine.conftest import hf_config, make_tokenizer

    torch.manual_seed(0)
    config = hf_config("llama")
    config.attention_bias = True
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, 0.15 if p.dim() > 1 else 0.1) if p.dim() > 1 or name.endswith("bias") else None
    model.save_pretrained(tmp_path, safe_serialization=True)
    make_tokenizer().save_pretrained(tmp_path)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        for _ in range(8):
            ids = torch.cat([ids, model(ids).logits[0, -1].argmax().view(1, 1)], dim=1)
    ours = make_llm(tmp_path).generate([PROMPT], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert ours[0].outputs[0].token_ids == ids[0, len(PROMPT):].tolist()


def test_penalties_and_bias_follow_vllm():
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25,
                            logit_bias={4: 3.0})
    seq = Sequence("r", [1, 2], params)
    seq.token_ids += [2, 3, 3]  # outputs: 2 once, 3 twice
    row = torch.tensor([1.0, -1.0, 2.0, 4.0, 0.5])
    apply_penalties(row, seq)
    expected = torch.tensor([1.0, -2.0, 1.0 - 0.5 - 0.25, 2.0 - 1.0 - 0.25, 3.5])
    assert torch.allclose(row, expected)


def test_logit_bias_steers_generation(llm):
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                                                logit_bias={42: 100.0}))[0]
    assert out.outputs[0].token_ids == [42] * 4


class _Engine:  # what parse_chat_request reads of the async engine
    def __init__(self, llm: LLM):
        self.engine = llm.llm_engine
        self.tokenizer = llm.get_tokenizer()
        self.model_name = "tiny"


@pytest.mark.parametrize("extra, param", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logit_bias": {"999999": 5}}, "logit_bias"),
    ({"presence_penalty": 3}, None),
])
def test_chat_server_refuses_what_it_cannot_honour(llm, extra, param):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **extra}
    with pytest.raises(ChatRequestError) as err:
        parse_chat_request(body, _Engine(llm))  # type: ignore[arg-type]
    assert err.value.status == 400 and err.value.param == param


def test_chat_server_maps_penalties(llm):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "frequency_penalty": 0.5,
            "presence_penalty": 0.2, "logit_bias": {"7": -100}, "tools": [], "tool_choice": "none"}
    params = parse_chat_request(body, _Engine(llm)).params  # type: ignore[arg-type]
    assert (params.frequency_penalty, params.presence_penalty, params.logit_bias) == (0.5, 0.2, {7: -100.0})


def test_profile_run_leaves_the_engine_as_it_was(llm):
    """The pass that sizes the KV cache on a GPU, run here on the CPU: a full step's token budget
    into a scratch cache, after which generation reads the real cache unchanged."""
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    before = llm.generate([PROMPT], params)[0]
    runner = llm.llm_engine.model_runner
    runner.profile_run()
    assert runner.model.attention_layers()[0].k_cache.data_ptr() == runner.kv_cache[0, 0].data_ptr()
    after = llm.generate([PROMPT], params)[0]
    assert after.outputs[0].token_ids == before.outputs[0].token_ids and after.num_cached_tokens > 0
