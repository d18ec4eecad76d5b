"""Load a checkpoint (a Hugging Face directory with *.safetensors, or a GGUF file) into our model.

The model is built on the meta device and given uninitialised storage on its real device, so no
random weights are ever materialised (an 8B model built the usual way would first take ~30 GiB
of fp32 noise); each checkpoint tensor is then copied in, through the layer's `weight_loader`
where the layer is fused or split across tensor-parallel ranks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import safe_open

from localengine.layers.linear import ColumnParallelLinear, LinearBase
from localengine.layers.quantization import DEFAULT_INT4_GROUP_SIZE, Int4Values
from localengine.layers.vocab_parallel import VocabParallelEmbedding
from localengine.models.awq_gptq import METHODS as INT4_CHECKPOINT_METHODS
from localengine.models.awq_gptq import Int4Checkpoint, int4_checkpoint_tensors
from localengine.models.llama import LlamaForCausalLM, ModelArgs


def checkpoint_tensors(path: Path, dtype: torch.dtype, keep_int4: frozenset[str] = frozenset(),
                       int4_checkpoint: Int4Checkpoint | None = None) -> Iterator[tuple[str, torch.Tensor | Int4Values]]:
    """(Hugging Face name, tensor) for every weight of the checkpoint at `path`; a GGUF's tensors
    named in `keep_int4`, and an AWQ/GPTQ checkpoint's linears (as `<linear>.weight`), come as
    4-bit groups."""
    if path.suffix == ".gguf":
        from localengine.models.gguf import gguf_tensors, open_gguf

        yield from gguf_tensors(open_gguf(path), dtype, keep_int4)
        return
    if int4_checkpoint is not None:
        yield from int4_checkpoint_tensors(int4_checkpoint, _safetensors(path))
        return
    yield from _safetensors(path)


def _safetensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path} (supported: safetensors directories, GGUF files)")
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            names = f.keys()  # a safetensors file handle, not a dict
            for name in names:
                if "rotary_emb.inv_freq" not in name:
                    yield name, f.get_tensor(name)


@dataclass(frozen=True, slots=True)
class QuantizationPlan:
    """What loading does to each weight beyond copying it in `dtype`."""

    int4_tensors: frozenset[str] = frozenset()  # checkpoint tensors loaded as 4-bit groups (GGUF Q4 blocks)
    int4_modules: frozenset[str] = frozenset()  # linears packed from them: never given a float weight
    after: tuple[tuple[str, str], ...] = ()  # (module, "int8" | "int4"): quantized once loaded
    group_size: int = DEFAULT_INT4_GROUP_SIZE
    int4_checkpoint: Int4Checkpoint | None = None  # an AWQ/GPTQ checkpoint's format


def _module_of(model: LlamaForCausalLM, name: str) -> tuple[str, int]:
    """(module name, shard) a checkpoint weight loads into (fused pieces: the fused module)."""
    for piece, (fused, shard) in model.packed_modules_mapping.items():
        if f".{piece}." in name:
            return name.replace(f".{piece}.", f".{fused}.").rsplit(".", 1)[0], shard
    return name.rsplit(".", 1)[0], 0


def quantization_plan(model: LlamaForCausalLM, path: Path, quantization: str | None,
                      group_size: int = DEFAULT_INT4_GROUP_SIZE, hf_config: dict[str, Any] | None = None) -> QuantizationPlan:
    """None: nothing. "bf16": every attention and MLP linear, the embedding and the LM head kept in bf16
    (multiplied in fp32), after loading. "int8" / "int4": every attention and MLP linear, after loading; the embedding
    (and the LM head, tied or not) int8. "gguf": what the file holds: linears whose pieces are all
    4-bit blocks (Q4_0, Q4_1, Q4_K) load as int4 at group 32; every other quantized weight (Q8_0,
    Q6_K, ..., a fused layer mixing types, the embedding) is dequantized exactly and requantized
    to int8 per row (more bits than the block's, so the rounding added is small); float tensors
    stay in `dtype`. "awq" / "gptq": every attention and MLP linear as the checkpoint's 4-bit
    groups; the embedding and LM head as the checkpoint has them (float), as vLLM runs them."""
    if quantization is None:
        return QuantizationPlan()
    if quantization in INT4_CHECKPOINT_METHODS:
        fmt = Int4Checkpoint.from_hf_config(hf_config or {})
        if fmt is None or fmt.method != quantization:
            raise ValueError(f"quantization={quantization!r} needs a checkpoint whose config.json says so "
                             f"(quantization_config.quant_method)")
        return QuantizationPlan(int4_modules=frozenset(n for n, m in model.named_modules() if isinstance(m, LinearBase)),
                                int4_checkpoint=fmt)
    if quantization in ("bf16", "int8", "int4"):
        rows = "bf16" if quantization == "bf16" else "int8"  # how the embedding and LM head are kept
        embeddings = [("model.embed_tokens", rows)] + ([] if model.args.tie_word_embeddings else [("lm_head", rows)])
        linears = [(name, quantization) for name, m in model.named_modules() if isinstance(m, LinearBase)]
        return QuantizationPlan(after=tuple(linears + embeddings), group_size=group_size)
    if quantization != "gguf":
        raise ValueError(f"unknown quantization {quantization!r}")
    from localengine.models.gguf import is_float_type, open_gguf
    from localengine.models.gguf_quants import int4_types

    pieces: dict[str, list[tuple[str, int]]] = {}
    for e in open_gguf(path).tensors:
        if len(e.shape) == 2:
            pieces.setdefault(_module_of(model, e.name)[0], []).append((e.name, e.ggml_type))
    int4, after = set(), []
    for module_name, tensors in pieces.items():
        if all(is_float_type(t) for _, t in tensors):
            continue
        module = model.get_submodule(module_name)
        if (isinstance(module, LinearBase) and len(tensors) == module.num_pieces
                and all(t in int4_types() for _, t in tensors)):
            int4.add(module_name)
        else:
            after.append((module_name, "int8"))
    return QuantizationPlan(frozenset(n for m in int4 for n, _ in pieces[m]), frozenset(int4), tuple(after))


def load_model(path: Path, hf_config: dict[str, Any], dtype: torch.dtype, device: torch.device,
               max_model_len: int, tp_rank: int = 0, tp_size: int = 1,
               quantization: str | None = None) -> LlamaForCausalLM:
    with torch.device("meta"):
        model = LlamaForCausalLM(ModelArgs.from_hf(hf_config, tp_rank, tp_size))
    plan = quantization_plan(model, path, quantization, hf_config=hf_config)
    for name in plan.int4_modules:  # packed straight from the file's blocks: no float storage at all
        del cast(LinearBase, model.get_submodule(name)).weight
    model = model.to_empty(device=device).to(dtype)
    if model.args.tie_word_embeddings:  # re-tie: to_empty gives every module its own storage
        model.lm_head.weight = model.model.embed_tokens.weight
    model.model.rotary_emb.build(max_model_len, device)
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    for name, tensor in checkpoint_tensors(path, dtype, plan.int4_tensors, plan.int4_checkpoint):
        if isinstance(tensor, Int4Values):
            module_name, shard = _module_of(model, name)
            values = tensor.map_rows(lambda t: t.to(device))  # read on the host; packed where it runs
            if cast(LinearBase, model.get_submodule(module_name)).load_int4(values, shard):
                loaded.add(module_name)
        else:
            _load_tensor(model, params, name, tensor, loaded)
    if model.args.tie_word_embeddings:
        loaded.add("lm_head.weight")
    missing = (set(params) - loaded) | (plan.int4_modules - loaded)
    if missing:
        raise ValueError(f"checkpoint {path} lacks weights: {sorted(missing)[:5]}")
    quantize_loaded(model, plan)
    return model.eval()


def quantize_loaded(model: LlamaForCausalLM, plan: QuantizationPlan) -> None:
    """The plan's quantization of weights already loaded (in float)."""
    for name, method in plan.after:
        module = model.get_submodule(name)
        if isinstance(module, VocabParallelEmbedding):
            module.quantize(method)
        else:
            cast(LinearBase, module).quantize(method, plan.group_size)
    if model.args.tie_word_embeddings and model.model.embed_tokens.quant is not None:
        model.lm_head.set_quantized(model.model.embed_tokens.quant, model.model.embed_tokens.dtype)


def _load_tensor(model: LlamaForCausalLM, params: dict[str, torch.nn.Parameter], name: str,
                 tensor: torch.Tensor, loaded: set[str]) -> None:
    for piece, (fused, shard) in model.packed_modules_mapping.items():
        if f".{piece}." in name:
            module_name, param_name = name.replace(f".{piece}.", f".{fused}.").rsplit(".", 1)
            fused_module = cast(ColumnParallelLinear, model.get_submodule(module_name))  # fused pieces are column-parallel
            fused_module.weight_loader(getattr(fused_module, param_name), tensor, shard)
            # The fused parameter counts as loaded once its last shard arrives.
            if shard == len(fused_module.output_sizes) - 1:
                loaded.add(f"{module_name}.{param_name}")
            return
    if name not in params:
        if name == "lm_head.weight" and model.args.tie_word_embeddings:
            return
        raise ValueError(f"unexpected checkpoint tensor {name!r}")
    param = params[name]
    module = model.get_submodule(name.rsplit(".", 1)[0])
    loader = getattr(module, "weight_loader", None)
    if loader is not None:
        loader(param, tensor)
    elif param.shape != tensor.shape:
        raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape {tuple(param.shape)}")
    else:
        param.data.copy_(tensor)
    loaded.add(name)
