"""Embedding and LM head split by vocabulary across tensor-parallel ranks (Megatron / vLLM).

Each rank holds a contiguous slice of the (padded) vocabulary. The embedding looks up the ids it
owns, zeroes the others and all-reduces; the LM head computes its slice of the logits and rank 0
gathers the slices. With tp_size 1 both are the plain layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from localengine import distributed
from localengine.layers.quantization import Bf16Weight, Int8Weight, float_linear


class VocabParallelEmbedding(nn.Module):
    weight: nn.Parameter
    quant: Int8Weight | Bf16Weight | None = None  # after `quantize`: looked up and multiplied from int8 or bf16 rows
    dtype: torch.dtype = torch.float32  # of the rows such a lookup returns

    def __init__(self, vocab_size: int, hidden_size: int, tp_rank: int = 0, tp_size: int = 1):
        super().__init__()
        self.vocab_size, self.tp_rank, self.tp_size = vocab_size, tp_rank, tp_size
        self.shard_size = -(-vocab_size // tp_size)
        self.start = tp_rank * self.shard_size
        self.weight = nn.Parameter(torch.empty(self.shard_size, hidden_size))

    def weight_loader(self, param: nn.Parameter, tensor: torch.Tensor, shard: int = 0) -> None:
        rows = tensor[self.start : self.start + self.shard_size]
        param.data.zero_()  # padding rows past the vocabulary stay zero
        param.data[: rows.shape[0]].copy_(rows)

    def quantize(self, method: str) -> None:
        """"int8": rows with one scale each, for the lookup and (tied, or as the LM head) the logits'
        matmul: a quarter of fp32's bytes, and the LM head is a fifth of a small model's weights.
        "bf16": the rows in bf16, widened exactly for both."""
        if method not in ("int8", "bf16"):
            raise ValueError(f"an embedding is kept as int8 or bf16, not {method!r}")
        weight = Int8Weight.from_float(self.weight) if method == "int8" else Bf16Weight.from_float(self.weight)
        self.set_quantized(weight, self.weight.dtype)

    def set_quantized(self, weight: Int8Weight | Bf16Weight, dtype: torch.dtype) -> None:
        self.quant, self.dtype = weight, dtype
        if "weight" in self._parameters:
            del self.weight

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight) if self.quant is None else self.quant.rows(ids, self.dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self._lookup(input_ids)
        local = input_ids - self.start
        owned = (local >= 0) & (local < self.shard_size)
        out = self._lookup(local.masked_fill(~owned, 0))
        out = out * owned.unsqueeze(-1).to(out.dtype)
        return distributed.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Logits over the whole vocabulary on rank 0; None on the other ranks."""
        logits = float_linear(hidden, self.weight) if self.quant is None else self.quant.matmul(hidden)
        if self.tp_size == 1:
            return logits
        full = distributed.gather_to_first(logits, self.tp_size)
        return full[:, : self.vocab_size] if full is not None else None
