"""The Llama family in one implementation: Llama 2/3, Mistral, Qwen2/2.5 and Qwen3.

The variants differ only in flags read from config.json:
- `attention_bias`: q/k/v biases (Qwen2 always has them);
- `qk_norm`: per-head RMSNorm on q and k before RoPE (Qwen3);
- `tie_word_embeddings`, `head_dim`, rope scaling.
Parameter names match Hugging Face's except the fused qkv_proj / gate_up_proj (see layers/linear.py).
With tensor parallelism (`tp_size` > 1) each rank builds the same model with its share of the
heads, MLP features and vocabulary; one RoPE table (sized by max_model_len) serves every layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from localengine.kernels import cpu_ops, reference
from localengine.layers.attention import Attention, AttentionMetadata
from localengine.layers.layernorm import RMSNorm
from localengine.layers.linear import ColumnParallelLinear, LinearBase, RowParallelLinear
from localengine.layers.rotary_embedding import RotaryEmbedding, apply_rotary
from localengine.layers.vocab_parallel import ParallelLMHead, VocabParallelEmbedding

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(slots=True)
class ModelArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_positions: int
    attention_bias: bool
    o_proj_bias: bool
    mlp_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    tp_rank: int = 0
    tp_size: int = 1

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], tp_rank: int = 0, tp_size: int = 1) -> ModelArgs:
        model_type = cfg.get("model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise NotImplementedError(f"model_type {model_type!r} is not supported (supported: {SUPPORTED_MODEL_TYPES})")
        # transformers 5 nests rope settings in rope_parameters; older configs use flat keys.
        rope = dict(cfg.get("rope_parameters") or {})
        theta = rope.pop("rope_theta", None) or cfg.get("rope_theta", 10000.0)
        scaling = rope if rope.get("rope_type", "default") != "default" else cfg.get("rope_scaling")
        heads = cfg["num_attention_heads"]
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=scaling,
            max_positions=cfg.get("max_position_embeddings", 4096),
            attention_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
            # Llama/Qwen3's attention_bias also covers o_proj; Qwen2 biases q/k/v only.
            o_proj_bias=model_type != "qwen2" and bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            tp_rank=tp_rank,
            tp_size=tp_size,
        )

    @property
    def num_local_heads(self) -> int:
        return self.num_heads // self.tp_size

    @property
    def num_local_kv_heads(self) -> int:
        return self.num_kv_heads // self.tp_size

    def check_tensor_parallel(self) -> None:
        for what, size in (("num_attention_heads", self.num_heads), ("num_key_value_heads", self.num_kv_heads),
                           ("intermediate_size", self.intermediate_size)):
            if size % self.tp_size:
                raise ValueError(f"{what} ({size}) is not divisible by tensor_parallel_size {self.tp_size}")


class LlamaAttention(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = a.num_local_heads, a.num_local_kv_heads, a.head_dim
        q_size, kv_size = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        tp = dict(tp_rank=a.tp_rank, tp_size=a.tp_size)
        self.qkv_proj = ColumnParallelLinear(a.hidden_size, [q_size, kv_size, kv_size], bias=a.attention_bias, **tp)
        self.o_proj = RowParallelLinear(q_size, a.hidden_size, bias=a.o_proj_bias, **tp)
        self.q_norm = RMSNorm(a.head_dim, a.rms_norm_eps) if a.qk_norm else None
        self.k_norm = RMSNorm(a.head_dim, a.rms_norm_eps) if a.qk_norm else None
        self.attn = Attention(self.num_heads, self.num_kv_heads, a.head_dim, a.head_dim**-0.5)

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        heads = self.num_heads + self.num_kv_heads
        qk = qkv[:, : heads * self.head_dim].view(-1, heads, self.head_dim)
        v = qkv[:, heads * self.head_dim :].view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
            qk = torch.cat([self.q_norm(q), self.k_norm(k)], dim=1)
        # q and k sit side by side in the fused projection: one rotation call for both.
        q, k = apply_rotary(qk, *rope).split([self.num_heads, self.num_kv_heads], dim=1)
        out = self.attn(q, k.contiguous(), v.contiguous(), meta)
        projected: torch.Tensor = self.o_proj(out.flatten(1))
        return projected


class LlamaMLP(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        tp = dict(tp_rank=a.tp_rank, tp_size=a.tp_size)
        self.gate_up_proj = ColumnParallelLinear(a.hidden_size, [a.intermediate_size] * 2, bias=a.mlp_bias, **tp)
        self.down_proj = RowParallelLinear(a.intermediate_size, a.hidden_size, bias=a.mlp_bias, **tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        ops = cpu_ops.for_fp32(gate_up)
        out: torch.Tensor
        if ops is not None and gate_up.shape[-1] % 16 == 0:
            out = self.down_proj(ops.silu_and_mul(gate_up.contiguous()))
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            out = self.down_proj(F.silu(gate) * up)
        return out


class LlamaDecoderLayer(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.self_attn = LlamaAttention(a)
        self.mlp = LlamaMLP(a)
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self._fused: FusedDecode | None = None

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor, residual: torch.Tensor | None,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's MLP output (its sum with `residual` is this layer's input), or the
        embeddings for the first layer (residual None). Returns this layer's (MLP output, residual)."""
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm.add_and_norm(x, residual)
        x = self.self_attn(rope, x, meta)
        x, residual = self.post_attention_layernorm.add_and_norm(x, residual)
        return self.mlp(x), residual

    def fused_decode(self, ops: cpu_ops.CpuOps, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor,
                     residual: torch.Tensor | None, meta: AttentionMetadata, block_tables: torch.Tensor,
                     context_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`forward` as one call of the engine's CPU op for a step whose every token is a row of decode
        attention (`block_tables`, `context_lens`: per token; the caller checks the step); None where
        the layer's weights or cache do not fit it."""
        fused = self._fused
        if fused is None or fused.version != LinearBase.weight_changes:
            fused = self._fused = FusedDecode(self)
        attn = fused.attn
        if (fused.weights is None or attn.observer is not None
                or reference.decode_attention_ops(x, attn.k_cache, attn.v_cache, attn.kv_scales) is None):
            return None
        if residual is None:  # the first layer: its input is the residual stream (x + 0 is exact)
            residual, x = x.clone(), torch.zeros_like(x)
        out = ops.decode_layer(x, residual, fused.weights, fused.kinds, fused.groups, fused.input_norm,
                               fused.post_norm, fused.eps, *rope, attn.k_cache, attn.v_cache, meta.slot_mapping,
                               block_tables, context_lens, attn.num_heads, attn.num_kv_heads, attn.scale,
                               fused.kv_scales())
        return out, residual


class FusedDecode:
    """A decoder layer's arguments for the engine's one-call decode layer (kernels/cpu_ops.cpp
    `decode_layer`; `weights` None where its linears do not fit it), made once and again only when
    a linear's weight was replaced after loading (`LinearBase.weight_changes`): a step reads no
    module attribute beyond these."""

    def __init__(self, layer: LlamaDecoderLayer):
        attn, mlp = layer.self_attn, layer.mlp
        self.version = LinearBase.weight_changes
        self.attn = attn.attn
        self.input_norm, self.post_norm = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        self.eps = layer.input_layernorm.eps
        linears = [lin.kernel_args() for lin in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)]
        args = [a for a in linears if a is not None]
        self.kinds = [kind for kind, _, _ in args]
        self.groups = [group for _, group, _ in args]
        self.weights = [t for _, _, tensors in args for t in tensors] if attn.q_norm is None and len(args) == 4 else None

    def kv_scales(self) -> list[torch.Tensor]:
        """A quantized (int8, fp8) cache's static scales as the op takes them (k, v, k_inv, v_inv); none for an fp32 cache.
        Read each step: the model runner sets them with the cache, after the layer is built."""
        s = self.attn.kv_scales
        return [] if s is None else [s.k, s.v, s.k_inv, s.v_inv]


class LlamaModel(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(a.vocab_size, a.hidden_size, a.tp_rank, a.tp_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(a) for _ in range(a.num_layers))
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(a.head_dim, a.rope_theta, a.rope_scaling)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        rope = self.rotary_emb(positions)  # looked up once per step, shared by every layer
        residual = None
        # A step of decodes and short queries over a cached prefix (speculative verification), fp32
        # on CPU: each layer is one call of the engine's op where it fits, every query token a row
        # of its attention with its own context length.
        plan = None
        if not meta.use_triton and x.shape[0] <= cpu_ops.MAX_ROWS and (ops := cpu_ops.for_fp32(x)) is not None:
            rows, tables, lens = reference.row_plan(meta)
            if rows.numel() == x.shape[0]:  # no prefill chunk in the step
                plan = (ops, tables, lens)
        for layer in self.layers:
            fused = None
            if plan is not None:
                fused = cast(LlamaDecoderLayer, layer).fused_decode(plan[0], rope, x, residual, meta, plan[1], plan[2])
            x, residual = fused if fused is not None else layer(rope, x, residual, meta)
        return self.norm.add_and_norm(x, residual)[0] if residual is not None else self.norm(x)


class LlamaForCausalLM(nn.Module):
    # Checkpoint name piece -> (fused module name piece, shard index).
    packed_modules_mapping: ClassVar[dict[str, tuple[str, int]]] = {
        "q_proj": ("qkv_proj", 0),
        "k_proj": ("qkv_proj", 1),
        "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, args: ModelArgs):
        super().__init__()
        args.check_tensor_parallel()
        self.args = args
        self.model = LlamaModel(args)
        self.lm_head = ParallelLMHead(args.vocab_size, args.hidden_size, args.tp_rank, args.tp_size)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        hidden: torch.Tensor = self.model(input_ids, positions, meta)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Logits over the whole vocabulary (None on tensor-parallel ranks other than 0)."""
        return self.lm_head.compute_logits(hidden)

    def attention_layers(self) -> list[Attention]:
        return [cast(LlamaDecoderLayer, layer).self_attn.attn for layer in self.model.layers]
