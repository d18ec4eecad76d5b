"""GGUF checkpoints (llama.cpp's single-file format) for the Llama family: Llama, Mistral, SmolLM,
Qwen2, Qwen3.

A GGUF holds the weights (often quantized) and, as metadata, the model's hyper-parameters, its
tokenizer (vocabulary, merges, special tokens) and its chat template. The `gguf` package reads it;
its reader walks every array element in Python (4-15 s for a 49k-token vocabulary on a 2-core
machine), so the first open converts what the engine needs into a directory under the data dir,
keyed by the file's path, size and mtime: `config.json` (Hugging Face names), the tokenizer
(`tokenizer.json`, built with `tokenizers`, see gguf_tokenizer.py) and `tensors.json` (each
tensor's offset, type and shape). Later opens read that directory and memory-map the file.

Weights are dequantized to the engine's dtype as they load (Q8_0, Q4_0, Q4_1 in torch here, other
GGML types through `gguf.quants`), except, when the loader keeps the file's quantization, the 4-bit
blocks of 2-D tensors: those come as 4-bit groups (gguf_quants.py) and are never made float.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from localengine.layers.quantization import Int4Values
from localengine.models.gguf_quants import int4_values

# Bump when what the cache directory holds changes: old entries are then rebuilt, not misread.
CACHE_FORMAT = 1
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")

# GGUF tensor name piece -> Hugging Face name piece, inside `blk.N.` / `model.layers.N.`.
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def data_dir() -> Path:
    """Slipstream's data directory (the SDK's rule: $SLIPSTREAM_DATA_DIR, else ~/.cache/slipstream)."""
    return Path(os.environ.get("SLIPSTREAM_DATA_DIR", Path.home() / ".cache" / "slipstream"))


@dataclass(frozen=True, slots=True)
class TensorEntry:
    name: str  # Hugging Face name
    ggml_type: int
    shape: tuple[int, ...]  # torch order (rows first)
    offset: int  # absolute, in the file
    nbytes: int
    unpermute_heads: int = 0  # llama.cpp permuted these rows for its rotary layout: undo with this many heads


@dataclass(frozen=True, slots=True)
class GGUFCheckpoint:
    path: Path
    cache_dir: Path  # config.json, tokenizer files, tensors.json
    hf_config: dict[str, Any]
    tensors: tuple[TensorEntry, ...]


def file_key(path: Path, *extra: str) -> str:
    """A short digest of a file's identity (its path, size and mtime) and `extra`: what is derived
    from the file is kept under it, and made again when the file changes."""
    st = path.stat()
    return hashlib.sha256(":".join([str(path.resolve()), str(st.st_size), str(st.st_mtime_ns), *extra]).encode()).hexdigest()[:20]


def cache_dir_for(path: Path) -> Path:
    return data_dir() / "localengine" / "gguf" / f"{path.stem}-{file_key(path, str(CACHE_FORMAT))}"


def open_gguf(path: Path) -> GGUFCheckpoint:
    """The checkpoint's config, tokenizer directory and tensor index, converted on first use."""
    cache = cache_dir_for(path)
    if not (cache / "tensors.json").is_file():
        _convert(path, cache)
    hf_config = json.loads((cache / "config.json").read_text())
    entries = tuple(TensorEntry(**{**e, "shape": tuple(e["shape"])})
                    for e in json.loads((cache / "tensors.json").read_text()))
    return GGUFCheckpoint(path, cache, hf_config, entries)


def _convert(path: Path, cache: Path) -> None:
    from gguf import GGUFReader

    from localengine.models.gguf_tokenizer import save_tokenizer

    reader = GGUFReader(str(path))
    meta = {name: field.contents() for name, field in reader.fields.items()
            if not name.startswith("tokenizer.ggml.") or name in _SMALL_TOKENIZER_FIELDS}
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise NotImplementedError(f"GGUF architecture {arch!r} is not supported (supported: {SUPPORTED_ARCHITECTURES})")
    tensor_names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in tensor_names:
        raise NotImplementedError(f"{path.name}: per-frequency rope factors (rope_freqs, Llama 3.1+) are not supported yet")
    hf_config = _hf_config(arch, meta, tensor_names, len(reader.fields["tokenizer.ggml.tokens"].data))
    heads = {"attn_q": hf_config["num_attention_heads"], "attn_k": hf_config["num_key_value_heads"]}
    entries = []
    for t in reader.tensors:
        name, piece = _hf_name(t.name)
        # llama.cpp's converter permutes Llama's q/k rows (interleaved rotary); Qwen's are stored as is.
        unpermute = heads.get(piece, 0) if arch == "llama" else 0
        entries.append({"name": name, "ggml_type": int(t.tensor_type), "shape": [int(d) for d in reversed(t.shape)],
                        "offset": int(t.data_offset), "nbytes": int(t.n_bytes), "unpermute_heads": unpermute})
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=cache.name + ".", dir=cache.parent))
    try:
        save_tokenizer(reader, meta, tmp)
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=1))
        (tmp / "tensors.json").write_text(json.dumps(entries))  # written last: its presence marks a whole entry
        try:
            tmp.rename(cache)
        except OSError:  # another process converted the same file first: keep its copy
            if not (cache / "tensors.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_SMALL_TOKENIZER_FIELDS = frozenset({
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id", "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_space_prefix",
})


def _hf_config(arch: str, meta: dict[str, Any], tensor_names: set[str], num_tokens: int) -> dict[str, Any]:
    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    eos = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    cfg: dict[str, Any] = {
        "model_type": arch,
        "vocab_size": int(get("vocab_size", num_tokens)),
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(get("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        # llama.cpp stops at any of these: chat models end a turn with eot (e.g. <|eot_id|>).
        "eos_token_id": sorted({int(i) for i in eos if i is not None}),
        "torch_dtype": "float32",
    }
    scaling = get("rope.scaling.type")
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise NotImplementedError(f"GGUF rope scaling {scaling!r} is not supported (supported: linear)")
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
    return cfg


def _hf_name(gguf_name: str) -> tuple[str, str]:
    """(Hugging Face name, GGUF piece) for a GGUF tensor name."""
    stem, _, kind = gguf_name.rpartition(".")
    if stem in _TOP_NAMES:
        return f"{_TOP_NAMES[stem]}.{kind}", stem
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{kind}", parts[2]
    raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")


def gguf_tensors(ckpt: GGUFCheckpoint, dtype: torch.dtype,
                 keep_int4: frozenset[str] = frozenset()) -> Iterator[tuple[str, torch.Tensor | Int4Values]]:
    """Each tensor under its Hugging Face name, in Hugging Face's layout: dequantized to `dtype`, or
    for the names in `keep_int4` (4-bit types) as 4-bit groups."""
    raw = np.memmap(ckpt.path, dtype=np.uint8, mode="r")
    for e in ckpt.tensors:
        data = torch.from_numpy(np.array(raw[e.offset:e.offset + e.nbytes]))
        if e.name in keep_int4:
            values = int4_values(data, e.ggml_type, e.shape)
            heads = e.unpermute_heads
            yield e.name, values.map_rows(functools.partial(_unpermute, heads=heads)) if heads else values
            continue
        tensor = dequantize(data, e.ggml_type, e.shape).to(dtype)
        if e.unpermute_heads:
            tensor = _unpermute(tensor, e.unpermute_heads)
        yield e.name, tensor


def is_float_type(ggml_type: int) -> bool:
    from gguf import GGMLQuantizationType as T

    return T(ggml_type) in (T.F32, T.F16, T.BF16)


def _unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's `permute` (convert_hf_to_gguf.py): rows per head go back from
    interleaved pairs to Hugging Face's rotate-half halves."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def dequantize(data: torch.Tensor, ggml_type: int, shape: tuple[int, ...]) -> torch.Tensor:
    """fp32 values of a GGML-typed tensor (`data`: its raw bytes)."""
    from gguf import GGMLQuantizationType as T

    kind = T(ggml_type)
    if kind in (T.F32, T.F16, T.BF16):
        dt = {T.F32: torch.float32, T.F16: torch.float16, T.BF16: torch.bfloat16}[kind]
        return data.view(dt).float().reshape(shape)
    if kind in (T.Q8_0, T.Q4_0, T.Q4_1):
        return _dequantize_q(data, kind, shape)
    from gguf.quants import dequantize as gguf_dequantize

    rows = data.numpy().reshape(shape[0], -1)
    return torch.from_numpy(np.ascontiguousarray(gguf_dequantize(rows, kind), dtype=np.float32)).reshape(shape)


def _dequantize_q(data: torch.Tensor, kind: Any, shape: tuple[int, ...]) -> torch.Tensor:
    """Blocks of 32 values with an fp16 scale (and for Q4_1 an fp16 minimum), ggml's layout: Q4
    nibbles hold values j (low) and j + 16 (high) of their block."""
    from gguf import GGMLQuantizationType as T

    head = 4 if kind == T.Q4_1 else 2
    blocks = data.reshape(-1, head + (32 if kind == T.Q8_0 else 16))
    scale = blocks[:, :2].contiguous().view(torch.float16).float()
    qs = blocks[:, head:]
    if kind == T.Q8_0:
        return (qs.contiguous().view(torch.int8).float() * scale).reshape(shape)
    q = torch.cat([qs & 0x0F, qs >> 4], dim=1).float()
    if kind == T.Q4_0:
        return ((q - 8) * scale).reshape(shape)
    minimum = blocks[:, 2:4].contiguous().view(torch.float16).float()
    return (q * scale + minimum).reshape(shape)
