"""AWQ and GPTQ 4-bit safetensors checkpoints, in their published layouts, as the engine's int4 groups.

Both store, per linear, `qweight` (int32 words of eight 4-bit values), `qzeros` (the same packing,
one 4-bit zero point per group and output feature) and `scales` (fp16 [groups, out]); the weight is
w = (q - z) * s. That is w = (q - 8) * scale + zero with scale = s and zero = (8 - z) * s, so the
nibbles load unchanged (layers/quantization.py rounds scale and zero to bf16 when packing, as for
GGUF's blocks). `config.json`'s `quantization_config` says which (vLLM's `quant_method`).

- AWQ (AutoAWQ's GEMM layout, `version: gemm`): `qweight` [in, out / 8], packed along the outputs
  in the order 0, 2, 4, 6, 1, 3, 5, 7 (word nibble i holds output 8c + order[i]); `qzeros`
  [groups, out / 8], packed the same way.
- GPTQ (AutoGPTQ / GPTQModel, `checkpoint_format` gptq): `qweight` [in / 8, out], packed along the
  inputs (word nibble i holds input 8r + i); `qzeros` [groups, out / 8], packed along the outputs,
  each stored as zero - 1 (gptq_v2 stores the zero itself); `g_idx` [in], the group of each input.
  Act-order checkpoints (`desc_act`, inputs not in group order) are refused: their inputs would
  have to be permuted, which the engine's kernels do not do.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from localengine.layers.quantization import Int4Values

METHODS = ("awq", "gptq")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # output 8c + AWQ_ORDER[i] sits in nibble i of word c
PARTS = ("qweight", "qzeros", "scales", "g_idx")


@dataclass(frozen=True, slots=True)
class Int4Checkpoint:
    method: str  # "awq" | "gptq"
    group_size: int
    zero_offset: int  # added to stored zeros: 1 for GPTQ's v1 format, else 0

    @classmethod
    def from_hf_config(cls, hf_config: dict[str, Any]) -> Int4Checkpoint | None:
        """The checkpoint's 4-bit format, None when it is not AWQ/GPTQ-quantized."""
        q = hf_config.get("quantization_config") or {}
        method = str(q.get("quant_method", "")).lower()
        if method not in METHODS:
            return None
        bits = q.get("bits", q.get("w_bit", 4))
        if bits != 4:
            raise NotImplementedError(f"{method.upper()} with {bits}-bit weights is not supported (4-bit only)")
        if method == "awq" and str(q.get("version", "gemm")).lower() != "gemm":
            raise NotImplementedError(f"AWQ layout {q.get('version')!r} is not supported (AutoAWQ's gemm layout only)")
        if method == "gptq" and q.get("desc_act"):
            raise NotImplementedError("GPTQ with desc_act (act-order) is not supported: its inputs are not in group order")
        group = int(q.get("group_size", q.get("q_group_size", 128)))
        v1 = method == "gptq" and str(q.get("checkpoint_format", "gptq")).lower() == "gptq"
        return cls(method, group, 1 if v1 else 0)

    def values(self, parts: dict[str, torch.Tensor]) -> Int4Values:
        """One linear's tensors as 4-bit groups over [out, in]."""
        qweight, qzeros, scales = parts["qweight"], parts["qzeros"], parts["scales"].float()
        if self.method == "awq":
            q = _reorder_awq(_nibbles(qweight)).t()  # [in, out] -> [out, in]
        else:
            q = _nibbles(qweight.t()).contiguous()  # words along the inputs: [out, in]
            g_idx = parts.get("g_idx")
            expected = torch.arange(q.shape[1]) // self._group(q.shape[1])
            if g_idx is not None and not torch.equal(g_idx.long(), expected):
                raise NotImplementedError("GPTQ g_idx is not in group order (act-order): not supported")
        zeros = _nibbles(qzeros)
        if self.method == "awq":
            zeros = _reorder_awq(zeros)
        zeros = (zeros.float() + self.zero_offset).t()  # [out, groups]
        scale = scales.t().contiguous()
        out, cols = q.shape
        if scale.shape != (out, cols // self._group(cols)) or zeros.shape != scale.shape:
            raise ValueError(f"{self.method.upper()} tensors disagree: weight {tuple(q.shape)}, scales "
                             f"{tuple(scales.shape)}, zeros {tuple(zeros.shape)}, group size {self.group_size}")
        return Int4Values(q.to(torch.uint8).contiguous(), scale, ((8 - zeros) * scale).contiguous())

    def _group(self, in_features: int) -> int:
        return in_features if self.group_size == -1 else self.group_size


def _nibbles(words: torch.Tensor) -> torch.Tensor:
    """int32 [r, c] -> [r, 8 c]: nibble i of word c at column 8 c + i."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    return ((words.to(torch.int32)[:, :, None] >> shifts) & 15).reshape(words.shape[0], -1)


def _reorder_awq(packed_order: torch.Tensor) -> torch.Tensor:
    """Columns in AWQ's nibble order -> natural order."""
    inverse = [AWQ_ORDER.index(j) for j in range(8)]
    cols = packed_order.shape[1]
    index = (torch.arange(cols).view(-1, 8)[:, inverse]).reshape(-1)
    return packed_order[:, index]


def int4_checkpoint_tensors(fmt: Int4Checkpoint,
                            tensors: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor | Int4Values]]:
    """The checkpoint's tensors with each quantized linear's parts replaced by `<linear>.weight` as
    4-bit groups (its other tensors, a bias, pass through)."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    needed = {"qweight", "qzeros", "scales"}
    for name, tensor in tensors:
        prefix, _, part = name.rpartition(".")
        if part not in PARTS:
            yield name, tensor
            continue
        parts = pending.setdefault(prefix, {})
        parts[part] = tensor
        # g_idx is optional and may come after the others: a GPTQ linear waits for it when it has one.
        if needed <= parts.keys() and (fmt.method == "awq" or "g_idx" in parts):
            yield f"{prefix}.weight", fmt.values(pending.pop(prefix))
    for prefix, parts in pending.items():
        if not needed <= parts.keys():
            raise ValueError(f"{fmt.method.upper()} linear {prefix} lacks {sorted(needed - parts.keys())}")
        yield f"{prefix}.weight", fmt.values(parts)
