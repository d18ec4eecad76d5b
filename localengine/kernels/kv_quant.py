"""Quantized KV cache (`kv_cache_dtype="int8" | "fp8"`): formats, scales, and the PyTorch side of
quantization (the Triton kernels in triton_attention.py do the same arithmetic on the GPU).

A key or value element is stored as one byte, `stored = quantize(x / scale)`, and read back as
`stored * scale`. Scales are static: one fp32 scale per (layer, KV head, channel) for keys and one
for values, measured once when the engine starts (`KVStats`: one prefill over a fixed text, K/V
recorded before they reach the cache) and never changed. So the cache costs exactly one byte per
element (half of bf16's two) with no per-token scale bytes, a block's values never need
rescaling when later tokens arrive, and the prefix cache can hand quantized blocks to any request.
Per-channel rather than vLLM's one scale per tensor: a few key channels carry values ten times
larger than the rest, and with int8 one scale for all of them leaves the others a handful of
levels (docs/localengine.md, "Quantized KV cache", has the measured agreement of both).

- Keys are rotated by RoPE after the projection, which moves each channel's value into its rotary
  partner (channel i pairs with i + head_dim/2) as the position grows; a key channel's bound is
  the largest norm of its pair, which no rotation can exceed, so contexts longer than the
  calibration text cannot outgrow it.
- A channel that was nearly silent in the calibration text still gets a bound of at least
  `FLOOR` times its head's largest, so a value it shows later is not clipped to nothing.
- `MARGIN` leaves headroom over what the calibration text reached; values beyond it saturate
  (int8 at +-127, e4m3 at +-448).
- int8 rounds to nearest, ties up (floor(x + 0.5): the same in PyTorch, Triton and its interpreter);
  e4m3 rounds to nearest even.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MARGIN = 1.25
FLOOR = 1 / 8
# Chat turns and code of the kinds the engine serves; enough tokens (~400) for K/V ranges to settle.
CALIBRATION_MESSAGES = [
    {"role": "user", "content": "Summarise the causes of the French Revolution in three sentences, then "
                                "list two books about it with their authors and years."},
    {"role": "assistant", "content": "Royal debt after the wars, bad harvests and bread prices, and the "
                                     "ideas of the Enlightenment turned the Estates-General of 1789 into a "
                                     "National Assembly. The nobility and clergy kept their privileges "
                                     "while the Third Estate paid the taxes. When the king wavered, Paris "
                                     "rose: the Bastille fell on 14 July. Books: Simon Schama, Citizens "
                                     "(1989); Georges Lefebvre, The Coming of the French Revolution (1939)."},
    {"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number, with a "
                                "test. Explain its complexity."},
    {"role": "assistant", "content": "```python\ndef fib(n: int) -> int:\n    a, b = 0, 1\n    for _ in "
                                     "range(n):\n        a, b = b, a + b\n    return a\n\n\ndef test_fib():\n"
                                     "    assert [fib(i) for i in range(8)] == [0, 1, 1, 2, 3, 5, 8, 13]\n```\n"
                                     "It runs in O(n) time and O(1) memory; fib(90) = 2880067194370816120 "
                                     "still fits in 64 bits. JSON: {\"n\": 10, \"fib\": 55, \"ok\": true}."},
    {"role": "user", "content": "Translate into German and Spanish: 'The train to Berlin leaves at 7:45 "
                                "from platform 3, please hurry!'"},
    {"role": "assistant", "content": "German: Der Zug nach Berlin fährt um 7:45 Uhr von Gleis 3 ab, bitte "
                                     "beeilen Sie sich! Spanish: El tren a Berlín sale a las 7:45 del andén "
                                     "3, ¡dense prisa, por favor!"},
]


@dataclass(frozen=True, slots=True)
class KVCacheFormat:
    name: str  # "int8" | "fp8_e4m3"
    dtype: torch.dtype  # what the cache tensor holds
    qmax: float  # the largest magnitude it stores

    @property
    def element_size(self) -> int:
        return torch.empty(0, dtype=self.dtype).element_size()


FORMATS = {"int8": KVCacheFormat("int8", torch.int8, 127.0),
           "fp8_e4m3": KVCacheFormat("fp8_e4m3", torch.float8_e4m3fn, 448.0)}
# vLLM's names ("fp8" is e4m3 there too) -> a format; "auto" keeps K/V in the model's dtype.
KV_CACHE_DTYPES: dict[str, str | None] = {"auto": None, "int8": "int8", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3"}


def kv_cache_format(kv_cache_dtype: str) -> KVCacheFormat | None:
    name = KV_CACHE_DTYPES[kv_cache_dtype]
    return None if name is None else FORMATS[name]


@dataclass(slots=True)
class KVScales:
    """One layer's scales, each [kv_heads, head_dim] fp32: key = stored * k, stored = round(key * k_inv)."""

    k: torch.Tensor
    v: torch.Tensor
    k_inv: torch.Tensor
    v_inv: torch.Tensor


def scales_for_layers(scales: torch.Tensor) -> list[KVScales]:
    """scales: [2 (keys, values), layers, kv_heads, head_dim] -> each layer's, as views."""
    inv = 1.0 / scales
    return [KVScales(scales[0, i], scales[1, i], inv[0, i], inv[1, i]) for i in range(scales.shape[1])]


def quantize(x: torch.Tensor, inv_scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x: [tokens, kv_heads, head_dim] in any float dtype -> the cache's element type."""
    y = x.float() * inv_scale
    if dtype == torch.int8:
        return torch.floor(y.clamp_(-127.0, 127.0) + 0.5).to(torch.int8)
    qmax = torch.finfo(dtype).max
    return y.clamp_(-qmax, qmax).to(dtype)  # e4m3fn has no infinity: out of range would be NaN


def storage(cache: torch.Tensor) -> torch.Tensor:
    """A byte view for indexing: PyTorch's CPU index kernels do not take float8 tensors."""
    return cache.view(torch.uint8) if cache.dtype == torch.float8_e4m3fn else cache


class KVStats:
    """Largest |K| and |V| per (layer, KV head, channel) seen while observing; keys as rotary pair norms."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, device: torch.device):
        self.absmax = torch.zeros(2, num_layers, num_kv_heads, head_dim, dtype=torch.float32, device=device)

    def observe(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        k, v = k.float(), v.float()
        half = k.shape[-1] // 2
        pair = torch.sqrt(k[..., :half] ** 2 + k[..., half : 2 * half] ** 2).amax(0)
        key = torch.cat([pair, pair, k[..., 2 * half :].abs().amax(0)], dim=-1)  # an odd last channel has no partner
        torch.maximum(self.absmax[0, layer], key, out=self.absmax[0, layer])
        torch.maximum(self.absmax[1, layer], v.abs().amax(0), out=self.absmax[1, layer])

    def scales(self, fmt: KVCacheFormat) -> torch.Tensor:
        """[2, layers, kv_heads, head_dim]: MARGIN over each channel's bound, itself at least FLOOR of its head's."""
        head_max = self.absmax.amax(-1, keepdim=True)
        bound = torch.maximum(self.absmax, head_max * FLOOR) * MARGIN
        # A head that never fired (bound 0) still needs a finite inverse: 0 * inf would be NaN.
        return (bound / fmt.qmax).clamp_(min=1e-8)
