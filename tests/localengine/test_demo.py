"""The bundled demo model and its draft load by name and generate text."""

from __future__ import annotations

from localengine import LLM, SamplingParams
from localengine.config import BUNDLED_MODELS


def test_demo_models_are_small_and_share_a_tokenizer():
    size = sum(f.stat().st_size for d in BUNDLED_MODELS.values() for f in d.iterdir())
    assert size <= 10 * 2**20
    assert (BUNDLED_MODELS["demo"] / "tokenizer.json").read_bytes() == (
        BUNDLED_MODELS["demo-draft"] / "tokenizer.json"
    ).read_bytes()


def test_demo_generates_and_chats():
    llm = LLM("demo", max_model_len=256, num_kvcache_blocks=64)
    out = llm.generate(["def main("], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 8 and out.outputs[0].text
    reply = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(temperature=0.7, seed=0, max_tokens=8))[0]
    assert reply.outputs[0].finish_reason in ("stop", "length")


def test_demo_draft_loads():
    llm = LLM("demo-draft", max_model_len=128, num_kvcache_blocks=32)
    assert llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=2))[0].outputs[0].token_ids
