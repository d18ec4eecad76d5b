"""GGUF checkpoints: tiny random Llama and Qwen2 models written the way llama.cpp's converter writes
them (Llama's q/k rows permuted, byte-level BPE vocabulary and merges as metadata), loaded by the
engine, and compared with the same weights loaded from the Hugging Face directory."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from localengine import SamplingParams
from localengine.models.gguf import dequantize
from tests.localengine.conftest import make_llm

gguf = pytest.importorskip("gguf")

GGUF_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
              "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}


def _gguf_name(hf: str) -> str:
    if hf.startswith("model.layers."):
        _, _, index, rest = hf.split(".", 3)
        module, kind = rest.rsplit(".", 1)
        return f"blk.{index}.{GGUF_NAMES[module]}.{kind}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}[hf]


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(hf_dir: Path, out: Path, arch: str, quantize: dict[str, str] | None = None) -> Path:
    """`quantize`: GGUF name prefix (after `blk.N.`) -> GGML type for those matrices (gguf's own quantizer)."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    template = AutoTokenizer.from_pretrained(str(hf_dir)).chat_template
    vocab = dict(tok["model"]["vocab"], **{t["content"]: t["id"] for t in tok["added_tokens"]})
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {t["content"] for t in tok["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w = gguf.GGUFWriter(str(out), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    w.add_vocab_size(cfg["vocab_size"])
    if cfg.get("head_dim"):
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_chat_template(template)
    heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}
    for name, tensor in load_file(str(hf_dir / "model.safetensors")).items():
        gname = _gguf_name(name)
        data = tensor.float().numpy()
        piece = gname.split(".")[2] if gname.startswith("blk.") else ""
        if arch == "llama" and piece in heads and gname.endswith(".weight"):
            data = _permute(data, heads[piece])
        base = gname.split(".", 2)[2] if gname.startswith("blk.") else gname
        kind = next((k for prefix, k in (quantize or {}).items() if base.startswith(prefix)), None)
        if kind is not None and data.ndim == 2:
            qtype = gguf.GGMLQuantizationType[kind]
            w.add_tensor(gname, gguf.quants.quantize(np.ascontiguousarray(data), qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gname, np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_gguf_generates_what_the_hf_checkpoint_does(model_dirs, tmp_path, arch):
    """Same weights, same greedy tokens: the q/k un-permutation (Llama), the biases (Qwen2), the q/k
    norms and head_dim (Qwen3) and the config read from metadata are right; the tokenizer and chat template come from the file."""
    hf_dir = model_dirs[arch]
    path = write_gguf(hf_dir, tmp_path / f"{arch}.gguf", arch)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = ["def add(a, b):", "The quick brown fox"]
    reference, loaded = make_llm(hf_dir), make_llm(path)
    assert [o.outputs[0].token_ids for o in loaded.generate(prompts, params)] == \
        [o.outputs[0].token_ids for o in reference.generate(prompts, params)]
    ours, theirs = loaded.get_tokenizer(), reference.get_tokenizer()
    text = "import os\nprint(sys.argv)  # Hello, world!"
    assert ours.encode(text) == theirs.encode(text) and ours.decode(ours.encode(text)) == text
    messages = [{"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert loaded.llm_engine.eos_token_ids == {0}


def test_second_open_reads_the_converted_copy(model_dirs, tmp_path, monkeypatch):
    """The tokenizer and tensor index are converted once (under the data dir); a later load does not
    parse the GGUF metadata again."""
    from localengine.models import gguf as gguf_module

    path = write_gguf(model_dirs["llama"], tmp_path / "tiny.gguf", "llama")
    first = gguf_module.open_gguf(path)

    def never(*_args: object) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_module, "_convert", never)
    again = gguf_module.open_gguf(path)
    assert again.cache_dir == first.cache_dir and again.tensors == first.tensors
    assert (again.cache_dir / "tokenizer.json").is_file()


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1"])
def test_block_dequantization_matches_gguf(kind):
    from gguf.quants import dequantize as reference
    from gguf.quants import quantize

    qtype = gguf.GGMLQuantizationType[kind]
    values = np.random.default_rng(0).normal(size=(6, 128)).astype(np.float32)
    packed = quantize(values, qtype)
    ours = dequantize(torch.from_numpy(packed.copy()).reshape(-1), int(qtype), (6, 128))
    assert torch.equal(ours, torch.from_numpy(reference(packed, qtype)))


def test_unsupported_options_are_refused_by_name(llama_dir):
    with pytest.raises(NotImplementedError, match="marlin"):
        make_llm(llama_dir, quantization="marlin")
    with pytest.raises(NotImplementedError, match="fp8_e5m2"):
        make_llm(llama_dir, kv_cache_dtype="fp8_e5m2")
