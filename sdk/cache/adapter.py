"""A low-rank (LoRA) adapter for MiniLM: what `train_embedder.py` learns, merged into the weights at load.

Only the adapter ships (`minilm-qqp-lora.safetensors`, ~1.3 MB fp16), not a second 90 MB model: each
adapted linear layer W of the bundled all-MiniLM-L6-v2 gets W + scale · up @ down at load time, so
inference costs exactly what the original model costs and the original stays available as the fallback.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ADAPTER = Path(__file__).with_name("minilm-qqp-lora.safetensors")
# Every linear layer of each BERT block: attention projections and the feed-forward pair.
TARGETS = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense", "intermediate.dense", "output.dense")


def adapter_id(path: Path = ADAPTER) -> str:
    """Short content hash: names the embedding space the adapter produces (memo files, verifier pairing)."""
    return "minilm-qqp-" + hashlib.sha256(path.read_bytes()).hexdigest()[:10]


def target_layers(model: torch.nn.Module) -> dict[str, torch.nn.Linear]:
    import torch

    return {name: module for name, module in model.named_modules() if isinstance(module, torch.nn.Linear) and name.endswith(TARGETS) and ".layer." in name}


def merge(model: torch.nn.Module, path: Path = ADAPTER) -> None:
    """Add the adapter's low-rank updates to the model's weights in place."""
    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    layers = target_layers(model)
    names = {key.rsplit(".", 1)[0] for key in tensors if key.endswith((".down", ".up"))}
    if not names or names - set(layers):
        raise ValueError(f"{path.name} does not fit this model: {sorted(names - set(layers))[:3]}")
    scale = float(tensors["scale"])
    with torch.no_grad():
        for name in names:
            weight = layers[name].weight
            weight += scale * (tensors[f"{name}.up"].float() @ tensors[f"{name}.down"].float()).to(weight.dtype)


class LowRank:
    """Training-time wrapper: a frozen linear layer plus a trainable low-rank update (up starts at zero)."""

    @staticmethod
    def wrap(model: torch.nn.Module, rank: int, alpha: float) -> dict[str, torch.nn.Module]:
        import torch

        class Adapted(torch.nn.Module):
            def __init__(self, base: torch.nn.Linear):
                super().__init__()
                self.base = base
                self.down = torch.nn.Parameter(torch.empty(rank, base.in_features))
                self.up = torch.nn.Parameter(torch.zeros(base.out_features, rank))
                torch.nn.init.kaiming_uniform_(self.down, a=5**0.5)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                out: torch.Tensor = self.base(x) + (x @ self.down.T @ self.up.T) * (alpha / rank)
                return out

        for parameter in model.parameters():
            parameter.requires_grad_(False)
        adapted: dict[str, torch.nn.Module] = {}
        for name, layer in target_layers(model).items():
            parent, _, child = name.rpartition(".")
            adapted[name] = Adapted(layer)
            setattr(model.get_submodule(parent), child, adapted[name])
        return adapted

    @staticmethod
    def load(adapted: dict[str, torch.nn.Module], path: Path) -> None:
        """Start from a saved adapter (to continue its training on more rows)."""
        import torch
        from safetensors.torch import load_file

        tensors = load_file(str(path))
        with torch.no_grad():
            for name, module in adapted.items():
                module.get_parameter("down").copy_(tensors[f"{name}.down"].float())
                module.get_parameter("up").copy_(tensors[f"{name}.up"].float())

    @staticmethod
    def save(adapted: dict[str, torch.nn.Module], rank: int, alpha: float, path: Path = ADAPTER) -> None:
        import torch
        from safetensors.torch import save_file

        tensors = {"scale": torch.tensor(alpha / rank)}
        for name, module in adapted.items():
            tensors[f"{name}.down"] = module.get_parameter("down").detach().to(torch.float16).contiguous()
            tensors[f"{name}.up"] = module.get_parameter("up").detach().to(torch.float16).contiguous()
        save_file(tensors, str(path))
