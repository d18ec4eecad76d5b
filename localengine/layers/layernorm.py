"""RMSNorm, computed in fp32 like the reference implementations (bf16 sums drift).

`add_and_norm` is vLLM's fused residual form: the residual stream is carried beside the layer's
input, and each norm first adds the sublayer's output to it. fp32 on CPU runs the engine's ops
(kernels/cpu_ops.cpp: one call, in place); other dtypes and devices run the same in PyTorch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from localengine.kernels import cpu_ops


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops = cpu_ops.for_fp32(x)
        if ops is not None:
            return ops.rms_norm(x.contiguous(), self.weight, self.eps)
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual); the engine's op overwrites x and residual with them."""
        ops = cpu_ops.for_fp32(x)
        if ops is not None and x.is_contiguous() and residual.is_contiguous():
            ops.fused_add_rms_norm(x, residual, self.weight, self.eps)
            return x, residual
        residual = x + residual
        return self(residual), residual
