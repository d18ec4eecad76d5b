"""Speculative decoding on the bundled real model (smollm2-135m-instruct): greedy tokens equal to
decoding without it, with n-gram lookup (accepted on a prompt whose answer copies its input) and
with an MLP speculator of the shape `localengine/demo/train_speculator.py` writes for it (tied
stages, a 2,048-token draft vocabulary, the target's embeddings), untrained: whatever it proposes,
the target's tokens are kept; and the two together (`prompt_lookup`)."""

from __future__ import annotations

import pytest

from localengine import LLM, SamplingParams
from localengine.config import packaged_model_path

try:
    packaged_model_path("smollm2-135m-instruct")
except FileNotFoundError as exc:  # the README's install commands put it there
    pytest.skip(str(exc), allow_module_level=True)

FUNCTION = '''def area(width, height):
    """Return the area of a rectangle."""
    if width < 0 or height < 0:
        raise ValueError("negative size")
    return width * height
'''
MESSAGES = [{"role": "user", "content": "Rewrite this function with `width` renamed to `w`. Reply with the code only."
                                        "\n\n" + FUNCTION}]
COMMON = {"dtype": "float32", "max_model_len": 512, "max_num_seqs": 2, "num_kvcache_blocks": 48}
PARAMS = SamplingParams(temperature=0, max_tokens=48)
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "adaptive": False}
PROSE = [{"role": "user", "content": "Write a short poem about the sea."}]


@pytest.fixture(scope="module")
def plain() -> LLM:
    return LLM("smollm2-135m-instruct", **COMMON)


@pytest.fixture(scope="module")
def untrained_speculator(tmp_path_factory) -> str:
    import torch

    from localengine.spec_decode.mlp_speculator import MLPSpeculator, MLPSpeculatorConfig

    torch.manual_seed(0)
    model = MLPSpeculator(MLPSpeculatorConfig(vocab_size=49152, emb_dim=576, n_predict=4, tie_weights=True,
                                              draft_vocab_size=2048, target_embeddings=True))
    out = tmp_path_factory.mktemp("smollm2-speculator")
    model.save(out)
    return str(out)


@pytest.mark.slow
@pytest.mark.timeout(900)  # two loads of the model and 48 decode steps on a shared CPU
@pytest.mark.parametrize(("method", "messages"), [("ngram", MESSAGES), ("mlp_speculator", PROSE),
                                                  ("mlp_speculator+lookup", MESSAGES)])
def test_speculation_keeps_greedy_tokens(plain, untrained_speculator, method, messages):
    spec = NGRAM if method == "ngram" else {"method": "mlp_speculator", "model": untrained_speculator,
                                            "num_speculative_tokens": 4, "adaptive": False,
                                            "prompt_lookup": method.endswith("+lookup")}
    reference = plain.chat(messages, PARAMS)[0].outputs[0].token_ids
    llm = LLM("smollm2-135m-instruct", speculative_config=spec, **COMMON)
    assert llm.chat(messages, PARAMS)[0].outputs[0].token_ids == reference
    stats = llm.spec_decode_stats()
    assert stats is not None and stats.num_drafts > 0  # proposals were made and verified
    if messages is MESSAGES:  # the answer copies the function: lookup's proposals are mostly the target's own
        assert stats.acceptance_rate > 0.5, stats
