"""Load a checkpoint (a Hugging Face directory with *.safetensors, or a GGUF file) into our model.

The model is built on the meta device and given uninitialised storage on its real device, so no
random weights are ever materialised (an 8B model built the usual way would first take ~30 GiB
of fp32 noise); each checkpoint tensor is then copied in, through the layer's `weight_loader`
where the layer is fused or split across tensor-parallel ranks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import safe_open

from localengine.layers.linear import ColumnParallelLinear
from localengine.models.llama import LlamaForCausalLM, ModelArgs


def checkpoint_tensors(path: Path, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, tensor) for every weight of the checkpoint at `path`."""
    if path.suffix == ".gguf":
        from localengine.models.gguf import gguf_tensors, open_gguf

        yield from gguf_tensors(open_gguf(path), dtype)
        return
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path} (supported: safetensors directories, GGUF files)")
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            names = f.keys()  # a safetensors file handle, not a dict
            for name in names:
                if "rotary_emb.inv_freq" not in name:
                    yield name, f.get_tensor(name)


def load_model(path: Path, hf_config: dict[str, Any], dtype: torch.dtype, device: torch.device,
               max_model_len: int, tp_rank: int = 0, tp_size: int = 1) -> LlamaForCausalLM:
    with torch.device("meta"):
        model = LlamaForCausalLM(ModelArgs.from_hf(hf_config, tp_rank, tp_size))
    model = model.to_empty(device=device).to(dtype)
    if model.args.tie_word_embeddings:  # re-tie: to_empty gives every module its own storage
        model.lm_head.weight = model.model.embed_tokens.weight
    model.model.rotary_emb.build(max_model_len, device)
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    for name, tensor in checkpoint_tensors(path, dtype):
        _load_tensor(model, params, name, tensor, loaded)
    if model.args.tie_word_embeddings:
        loaded.add("lm_head.weight")
    missing = set(params) - loaded
    if missing:
        raise ValueError(f"checkpoint {path} lacks weights: {sorted(missing)[:5]}")
    return model.eval()


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
