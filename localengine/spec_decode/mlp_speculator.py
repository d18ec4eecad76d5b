"""MLP speculator: k tokens from the target's own last hidden state, no draft model pass.

The architecture of IBM's speculators (Wertheimer et al., "Accelerating Production LLMs with
Combined Token/Embedding Speculators", arXiv:2404.19124; vLLM's `mlp_speculator` method), with
their checkpoint layout (`config.json` with `n_predict`, `emb_dim`, `inner_dim`, `tie_weights`,
`scale_input`; tensors `emb.i`, `proj.i`, `head.i`, `ln.i`). Stage i takes the state and the
token just emitted and returns the next state and logits for the token after it:

    state = gelu(ln_i(proj_i(state) + emb_i(token) * emb_weight / state_weight))
    logits = head_i(state)

starting from the target's final-norm hidden state at the position that produced the last token.
Two additions for targets with large vocabularies (SmolLM2: 49,152 tokens, where one full-vocabulary
head costs a fifth of a target step): `draft_vocab_size` > 0 gives every head only the target's
most frequent output tokens (tensor `draft_vocab`, their ids; FR-Spec's frequency-ranked draft
vocabulary, Zhao et al. 2025, arXiv:2502.14856), and `target_embeddings` makes the stages embed
tokens with the target's own input embedding instead of tables of their own (nothing stored; the
proposer attaches it). Neither is in vLLM's layout; a checkpoint without them is IBM's.
Each stage is a few small matmuls over the batch (no attention, no KV cache, no per-layer
scheduling), so k proposals cost a fraction of one target step even on a CPU, where a separate
draft model costs nearly a whole one. Trained on the target's own greedy outputs
(`localengine/demo/train_speculator.py`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from localengine.kernels import cpu_ops
from localengine.layers.vocab_parallel import VocabParallelEmbedding

ARCHITECTURE = "MLPSpeculatorPreTrainedModel"


@dataclass(slots=True)
class MLPSpeculatorConfig:
    vocab_size: int
    emb_dim: int  # the target's hidden size
    inner_dim: int = 0  # 0: emb_dim
    n_predict: int = 4  # stages, the most tokens one call proposes
    tie_weights: bool = False  # one emb/proj/ln/head shared by stages 2..n (stage 1's proj stays its own)
    scale_input: bool = False  # RMS-normalise the incoming hidden state (divided by sqrt 2)
    draft_vocab_size: int = 0  # 0: heads over the whole vocabulary; else over `draft_vocab`'s ids
    target_embeddings: bool = False  # embed tokens with the target's input embedding (needs inner = emb_dim)

    @classmethod
    def from_json(cls, path: Path) -> MLPSpeculatorConfig:
        raw = json.loads(path.read_text())
        if ARCHITECTURE not in raw.get("architectures", [ARCHITECTURE]):
            raise ValueError(f"{path} is not an MLP speculator (architectures {raw.get('architectures')})")
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


class ScaleNorm(nn.Module):
    """RMS normalisation with an optional learned scale and shift (the speculator's `ln`)."""

    def __init__(self, dim: int, affine: bool = True, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight is not None and self.bias is not None:
            x = torch.addcmul(self.bias, x, self.weight)
        return x


class MLPSpeculator(nn.Module):
    draft_vocab: torch.Tensor  # a buffer: [draft_vocab_size] target token ids

    def __init__(self, config: MLPSpeculatorConfig):
        super().__init__()
        self.config = config
        n, inner = config.n_predict, config.inner_dim or config.emb_dim
        self.n_predict = n
        if config.target_embeddings and inner != config.emb_dim:
            raise ValueError("target_embeddings needs inner_dim equal to emb_dim (the target's hidden size)")
        head_size = config.draft_vocab_size or config.vocab_size

        def stages(make: Callable[[], nn.Module], first: nn.Module | None = None) -> nn.ModuleList:
            if config.tie_weights:
                shared = make()
                return nn.ModuleList([first or shared] + [shared] * (n - 1))
            return nn.ModuleList([first or make()] + [make() for _ in range(n - 1)])

        self.emb = None if config.target_embeddings else stages(lambda: nn.Embedding(config.vocab_size, inner))
        # The target's embedding lookup, attached (a function, not a submodule: never saved or cast).
        self.target_embed: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.proj = stages(lambda: nn.Linear(inner, inner, bias=False), nn.Linear(config.emb_dim, inner, bias=False))
        self.ln = stages(lambda: ScaleNorm(inner))
        self.head = stages(lambda: nn.Linear(inner, head_size, bias=False))
        # Head index -> target token id; 0 rows without a draft vocabulary.
        self.register_buffer("draft_vocab", torch.arange(config.draft_vocab_size, dtype=torch.int64))
        self.ln0 = ScaleNorm(config.emb_dim, affine=False) if config.scale_input else None
        # The paper's weighting keeps the state's and the embedding's contributions balanced
        # over n stages; the ratio is all that matters before the normalisation.
        state_weight = 0.5 ** (0.5 / n)
        self.emb_scale = math.sqrt((1 - state_weight**2) * (inner / 2)) / state_weight

    def attach_target_embedding(self, embed: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """`embed`: token ids [B] -> [B, emb_dim], the target's own lookup (whatever its weights' format)."""
        self.target_embed = embed

    def embed(self, i: int, tokens: torch.Tensor) -> torch.Tensor:
        if self.emb is not None:
            embedded: torch.Tensor = self.emb[i](tokens)
            return embedded
        if self.target_embed is None:
            raise RuntimeError("this speculator embeds with the target's embedding: attach_target_embedding first")
        return self.target_embed(tokens)

    def token_ids(self, head_index: torch.Tensor) -> torch.Tensor:
        """Target token ids of head outputs (the identity without a draft vocabulary)."""
        return self.draft_vocab[head_index] if self.config.draft_vocab_size else head_index

    def full_vocab_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Head logits [B, draft vocab] spread over the target's vocabulary, -inf elsewhere: the
        rejection sampler needs q over the tokens the target can emit."""
        if not self.config.draft_vocab_size:
            return logits
        full = logits.new_full((logits.shape[0], self.config.vocab_size), float("-inf"))
        return full.index_copy_(1, self.draft_vocab, logits)

    def start(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.ln0(hidden) / math.sqrt(2) if self.ln0 is not None else hidden

    def stage(self, i: int, state: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One stage: the next state and head logits [B, V or draft vocab] for the token after
        `tokens` (target token ids)."""
        state = self.proj[i](state).add_(self.embed(i, tokens), alpha=self.emb_scale)
        state = F.gelu(self.ln[i](state))
        return state, self.head[i](state)

    def forward(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits for training: hidden [N, D] at position t, tokens [N, n] the
        tokens at t+1 .. t+n; returns head logits [N, n, V or draft vocab] for the tokens at t+2 .. t+n+1."""
        state, out = self.start(hidden), []
        for i in range(self.n_predict):
            state, logits = self.stage(i, state, tokens[:, i])
            out.append(logits)
        return torch.stack(out, dim=1)

    @torch.inference_mode()
    def propose_greedy(self, hidden: torch.Tensor, last_tokens: torch.Tensor, k: int) -> torch.Tensor:
        """k argmax proposals per row [B, k], each stage fed the previous stage's proposal."""
        native = self._native_greedy(hidden, last_tokens, k)
        if native is not None:
            return native
        state, tokens, out = self.start(hidden), last_tokens, []
        for i in range(k):
            state, logits = self.stage(i, state, tokens)
            tokens = self.token_ids(logits.argmax(dim=-1))
            out.append(tokens)
        return torch.stack(out, dim=1)

    def _native_greedy(self, hidden: torch.Tensor, last_tokens: torch.Tensor, k: int) -> torch.Tensor | None:
        """`propose_greedy` as one call of the engine's CPU op (kernels/cpu_speculator.cpp), where it
        applies: fp32 on CPU, decode-sized batches, embedding tables it can read as plain rows."""
        ops = cpu_ops.for_fp32(hidden)
        if ops is None or hidden.shape[0] > cpu_ops.MAX_ROWS:
            return None
        tables = self._embedding_tables(k)
        norms = [cast(ScaleNorm, ln) for ln in self.ln[:k]]
        weights = [n.weight for n in norms if n.weight is not None]
        biases = [n.bias for n in norms if n.bias is not None]
        if tables is None or len(weights) < len(norms) or len(biases) < len(norms):
            return None
        return ops.mlp_speculate_greedy(
            self.start(hidden).contiguous(), last_tokens.to(torch.int64), [cast(nn.Linear, p).weight for p in self.proj[:k]],
            tables, weights, biases, [cast(nn.Linear, h).weight for h in self.head[:k]],
            self.draft_vocab, self.emb_scale, norms[0].eps, k)

    def _embedding_tables(self, k: int) -> list[torch.Tensor] | None:
        """Each stage's embedding weight [V, inner]: its own, or the target's when that is a plain
        fp32 table on one rank (not int8 rows, not a tensor-parallel shard); None otherwise."""
        if self.emb is not None:
            return [cast(nn.Embedding, e).weight for e in self.emb[:k]]
        target = self.target_embed
        if isinstance(target, VocabParallelEmbedding) and target.quant is None and target.tp_size == 1:
            return [target.weight] * k
        return None

    def save(self, out: Path) -> None:
        """fp16 safetensors plus config.json, the layout `load_speculator` (and vLLM) read."""
        out.mkdir(parents=True, exist_ok=True)
        tensors, seen = {}, set()
        for name, param in self.named_parameters(remove_duplicate=False):
            if id(param) in seen:
                continue  # tied stages: stored once, under the first stage that owns them
            seen.add(id(param))
            tensors[name] = param.detach().to(torch.float16).contiguous()
        if self.config.draft_vocab_size:
            tensors["draft_vocab"] = self.draft_vocab.contiguous()
        save_file(tensors, str(out / "model.safetensors"))
        config = {"architectures": [ARCHITECTURE], "model_type": "mlp_speculator", **asdict(self.config)}
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def load_speculator(path: Path, dtype: torch.dtype, device: torch.device) -> MLPSpeculator:
    config = MLPSpeculatorConfig.from_json(path / "config.json")
    model = MLPSpeculator(config)
    params: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    if config.draft_vocab_size:
        params["draft_vocab"] = model.draft_vocab
    loaded: set[int] = set()
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safetensors' safe_open has keys(), no __iter__
                param = params.get(name.removeprefix("speculator."))
                if param is None:
                    raise ValueError(f"unexpected speculator tensor {name!r} in {file}")
                tensor = f.get_tensor(name)
                if param.shape != tensor.shape:
                    raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(param.shape)}")
                with torch.no_grad():
                    param.copy_(tensor)
                loaded.add(id(param))
    missing = [n for n, p in params.items() if id(p) not in loaded]
    if missing:
        raise ValueError(f"speculator checkpoint {path} lacks weights: {missing[:5]}")
    return model.to(device=device, dtype=dtype).eval()  # .to casts floating tensors only: ids stay int64
