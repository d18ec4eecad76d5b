"""Proposer for `method: "mlp_speculator"`: drafts from the hidden state the target just computed.

The model runner keeps, for every token it emits, the final hidden state that produced it
(`ModelRunner.keep_hidden`; the engine stores it on the sequence as `last_hidden`). Proposing is
then k speculator stages over the whole batch at once: no draft KV cache, no catch-up pass, no
per-request forward, one host copy of the proposals. Greedy requests get argmax proposals
(one-hot q); sampled requests draw each proposal from the speculator's distribution shaped by
their own temperature/top-k/top-p, and those probabilities go to the rejection sampler as q,
so the output distribution stays the target's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch

from localengine.config import Config, SpeculativeConfig, resolve_model_path
from localengine.engine.sequence import Sequence
from localengine.layers.sampler import Sampler
from localengine.spec_decode.mlp_speculator import load_speculator
from localengine.spec_decode.proposer import Proposal

if TYPE_CHECKING:
    from localengine.models.llama import LlamaForCausalLM


class MLPSpeculatorProposer:
    def __init__(self, target: Config, spec: SpeculativeConfig, target_model: LlamaForCausalLM):
        assert spec.model is not None
        device = target.torch_device
        self.model = load_speculator(resolve_model_path(spec.model), target.torch_dtype, device)
        cfg, args = self.model.config, target_model.args
        if cfg.emb_dim != args.hidden_size or cfg.vocab_size != args.vocab_size:
            raise ValueError(
                f"speculator {spec.model!r} was trained for hidden size {cfg.emb_dim} and vocabulary "
                f"{cfg.vocab_size}; the target has {args.hidden_size} and {args.vocab_size}")
        if cfg.target_embeddings:
            self.model.attach_target_embedding(target_model.model.embed_tokens)
        if spec.num_speculative_tokens > cfg.n_predict:
            raise ValueError(f"speculator {spec.model!r} proposes at most {cfg.n_predict} tokens "
                             f"(num_speculative_tokens is {spec.num_speculative_tokens})")
        self.generator = torch.Generator(device=device).manual_seed(target.seed + 1)
        self.target_params = sum(p.numel() for p in target_model.parameters())

    def cost_ratio(self) -> float:
        """Starting estimate of one stage's cost relative to a target step: its matmul weights
        over the target's (the embedding row is a lookup). The policy then measures."""
        stage = sum(cast(torch.nn.Linear, layers[-1]).weight.numel() for layers in (self.model.proj, self.model.head))
        return stage / self.target_params

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], num_tokens: list[int]) -> list[Proposal]:
        out = [Proposal([]) for _ in seqs]
        rows = [i for i, (s, k) in enumerate(zip(seqs, num_tokens, strict=True)) if k > 0 and s.last_hidden is not None]
        if not rows:
            return out
        batch = [seqs[i] for i in rows]
        hidden = torch.stack([s.last_hidden for s in batch])  # type: ignore[misc]
        last = torch.tensor([s.token_ids[-1] for s in batch], device=hidden.device)
        k = max(num_tokens[i] for i in rows)
        sampled = [j for j, s in enumerate(batch) if not s.sampling_params.greedy]
        if not sampled:
            tokens = self.model.propose_greedy(hidden, last, k).tolist()
            probs: list[list[torch.Tensor]] = [[] for _ in batch]
        else:
            tokens, probs = self._propose_sampled(hidden, last, k, batch, sampled)
        for j, i in enumerate(rows):
            n = num_tokens[i]
            out[i] = Proposal(tokens[j][:n], torch.stack(probs[j][:n]) if probs[j] else None)
        return out

    def _propose_sampled(self, hidden: torch.Tensor, last: torch.Tensor, k: int, batch: list[Sequence],
                         sampled: list[int]) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
        """Stage by stage: argmax for greedy rows, a draw from the shaped distribution for the
        others (noise from each request's own generator when it has one, as the sampler does)."""
        model, state, tokens = self.model, self.model.start(hidden), last
        idx = torch.tensor(sampled, device=hidden.device)
        sampled_seqs = [batch[j] for j in sampled]
        steps: list[torch.Tensor] = []
        probs: list[list[torch.Tensor]] = [[] for _ in batch]
        for stage in range(k):
            state, head_logits = model.stage(stage, state, tokens)
            tokens = model.token_ids(head_logits.argmax(dim=-1))
            logits = model.full_vocab_logits(head_logits[idx])
            q = Sampler.compute_probs(logits, sampled_seqs)
            noise = torch.empty_like(q).exponential_(generator=self.generator)
            for r, seq in enumerate(sampled_seqs):
                if seq.generator is not None:
                    noise[r].exponential_(generator=seq.generator)
            tokens = tokens.index_copy(0, idx, (q / noise).argmax(dim=-1))
            steps.append(tokens)
            for r, j in enumerate(sampled):
                probs[j].append(q[r])
        return torch.stack(steps, dim=1).tolist(), probs

    def free(self, request_id: str) -> None:
        pass  # nothing per request: the hidden state lives on the sequence
