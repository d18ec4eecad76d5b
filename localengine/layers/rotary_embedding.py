"""Rotary position embedding (rotate-half layout, as in Hugging Face checkpoints).

cos/sin are precomputed for every position up to max_model_len (not the checkpoint's
max_position_embeddings: 128k positions would cost hundreds of MB) and indexed by each token's
absolute position, so sequences at different positions share one batched call.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from localengine.kernels import cpu_ops


def _inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    rope_type = (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
    if rope_type == "default":
        return inv_freq
    assert scaling is not None
    if rope_type == "linear":
        factor: float = scaling["factor"]
        return inv_freq / factor
    if rope_type == "llama3":
        # Llama 3.1+: keep high frequencies, stretch low ones, blend in between.
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        out = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        medium = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        return torch.where(medium, blended, out)
    raise NotImplementedError(f"rope scaling type {rope_type!r} is not supported")


class RotaryEmbedding(nn.Module):
    """cos/sin for every position up to max_model_len, built once (fp32) by `build` after the
    model is placed on its device; the model looks them up once per step for all layers."""

    def __init__(self, head_dim: int, theta: float, scaling: dict[str, Any] | None = None):
        super().__init__()
        self.head_dim, self.theta, self.scaling = head_dim, theta, scaling
        self.cos = self.sin = torch.empty(0)

    def build(self, max_positions: int, device: torch.device) -> None:
        inv_freq = _inv_freq(self.head_dim, self.theta, self.scaling).float().to(device)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32, device=device), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x: [tokens, heads, head_dim] by its positions' cos/sin, in fp32, cast back. fp32 on CPU
    runs the engine's op (kernels/cpu_ops.cpp), which rotates x in place and returns it."""
    ops = cpu_ops.for_fp32(x)
    if ops is not None and x.stride(-1) == 1 and x.stride(-2) == x.shape[-1]:
        ops.rotary_embedding(x, cos, sin)
        return x
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)
