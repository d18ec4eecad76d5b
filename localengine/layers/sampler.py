"""Token sampling for a batch with per-request parameters.

Temperature, then top-k, then top-p shape each row's distribution; the token is drawn with the
exponential race argmax(p / E), E ~ Exp(1), which samples exactly from p without normalising it
or calling torch.multinomial. Seeded requests draw their noise from their own generator, so their
tokens do not depend on what else is in the batch. Penalties, logit biases and the min_tokens ban
shape the logits the token is drawn from; logprobs are those of the raw model distribution
(vLLM's default), before any of them and before temperature and truncation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from localengine.engine.sequence import Sequence
from localengine.outputs import Logprob


@dataclass(slots=True)
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[dict[int, Logprob] | None]


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask logits outside each row's top-k / nucleus with -inf. top_k = vocab disables it."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    drop = ranks >= top_k[:, None]
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    # Drop a token when the tokens ranked above it already cover top_p; the top token always stays.
    drop |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
    drop[:, 0] = False
    return logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


def apply_penalties(row: torch.Tensor, seq: Sequence) -> None:
    """vLLM's penalties on one row of logits, in place: repetition (CTRL: divide positive logits,
    multiply negative ones, for every token of the prompt and output), then frequency and presence
    (OpenAI: subtract per occurrence / once, for output tokens), then the logit bias."""
    params = seq.sampling_params
    vocab = row.shape[-1]
    if params.repetition_penalty != 1.0:
        seen = torch.zeros(vocab, dtype=torch.bool, device=row.device)
        seen[torch.tensor(seq.token_ids, device=row.device)] = True
        penalized = torch.where(row > 0, row / params.repetition_penalty, row * params.repetition_penalty)
        row.copy_(torch.where(seen, penalized, row))
    if (params.frequency_penalty or params.presence_penalty) and seq.num_output_tokens:
        counts = torch.bincount(torch.tensor(seq.output_token_ids, device=row.device), minlength=vocab)[:vocab]
        row -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), device=row.device)
        row[ids] += torch.tensor(list(params.logit_bias.values()), device=row.device, dtype=row.dtype)


class Sampler:
    def __init__(self, seed: int, eos_token_ids: set[int], device: torch.device | None = None):
        # Noise is drawn where the logits are: a CPU draw copied over each step would bound any
        # sampled workload on a GPU (16 x 152k vocab: ~0.5 s per step).
        self.generator = torch.Generator(device=device or "cpu").manual_seed(seed)
        self.eos_token_ids = sorted(eos_token_ids)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> SamplerOutput:
        raw = logits.float()
        logits = self._shape(raw, seqs)
        greedy_tokens = logits.argmax(dim=-1)
        tokens = greedy_tokens
        if not all(s.sampling_params.greedy for s in seqs):
            tokens = torch.where(self._greedy_mask(seqs, logits.device), greedy_tokens, self._sample(logits, seqs))
        token_list = tokens.tolist()
        return SamplerOutput(token_list, self._logprobs(raw, seqs, token_list))

    def _shape(self, raw: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """The logits to draw from: `raw` itself when no request shapes them, else a copy with
        each request's penalties, biases and min_tokens ban applied."""
        rows = [i for i, s in enumerate(seqs) if s.sampling_params.shapes_logits or self._banned(s)]
        if not rows:
            return raw
        logits = raw.clone()
        for i in rows:
            apply_penalties(logits[i], seqs[i])
            banned = self._banned(seqs[i])
            if banned:
                # Until a request has min_tokens outputs, the tokens that would stop it cannot be drawn.
                logits[i, banned] = float("-inf")
        return logits

    def _banned(self, seq: Sequence) -> list[int]:
        params = seq.sampling_params
        if seq.num_output_tokens >= params.min_tokens:
            return []
        return list(params.stop_token_ids) + ([] if params.ignore_eos else self.eos_token_ids)

    @staticmethod
    def _greedy_mask(seqs: list[Sequence], device: torch.device) -> torch.Tensor:
        return torch.tensor([s.sampling_params.greedy for s in seqs], device=device)

    @staticmethod
    def compute_probs(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Each row's sampling distribution: temperature, top-k, top-p (speculative decoding
        verifies against this same distribution, so it stays exactly what plain sampling draws)."""
        vocab = logits.shape[-1]
        params = [s.sampling_params for s in seqs]
        temps = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=logits.device)
        logits = logits.float() / temps[:, None]
        if any(0 < p.top_k < vocab or p.top_p < 1.0 for p in params):
            top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=logits.device)
            top_p = torch.tensor([p.top_p for p in params], device=logits.device)
            logits = apply_top_k_top_p(logits, top_k, top_p)
        return logits.softmax(dim=-1)

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        probs = self.compute_probs(logits, seqs)
        noise = torch.empty(probs.shape, dtype=torch.float32, device=probs.device).exponential_(generator=self.generator)
        for i, seq in enumerate(seqs):
            if seq.generator is not None:
                noise[i].exponential_(generator=seq.generator)
        return (probs / noise).argmax(dim=-1)

    @staticmethod
    def _logprobs(logits: torch.Tensor, seqs: list[Sequence], tokens: list[int]) -> list[dict[int, Logprob] | None]:
        """The sampled token's logprob and rank plus the top-N, for the rows that ask: computed
        for all those rows at once and brought to the host together (no per-row `.item()`)."""
        wanted = [s.sampling_params.logprobs for s in seqs]
        rows = [i for i, n in enumerate(wanted) if n is not None]
        if not rows:
            return [None] * len(seqs)
        logprobs = (logits if len(rows) == len(seqs) else logits[rows]).log_softmax(dim=-1)
        chosen_ids = torch.tensor([tokens[i] for i in rows], device=logits.device)
        chosen = logprobs.gather(1, chosen_ids[:, None])
        ranks = (logprobs > chosen).sum(dim=1) + 1
        top = max(wanted[i] or 0 for i in rows)
        values, ids = logprobs.topk(top, dim=-1) if top else (chosen[:, :0], chosen_ids[:, None][:, :0])
        chosen_l, ranks_l, values_l, ids_l = chosen[:, 0].tolist(), ranks.tolist(), values.tolist(), ids.tolist()
        out: list[dict[int, Logprob] | None] = [None] * len(seqs)
        for r, i in enumerate(rows):
            entry = {tokens[i]: Logprob(chosen_l[r], ranks_l[r])}
            n = wanted[i] or 0
            for rank, (tid, lp) in enumerate(zip(ids_l[r][:n], values_l[r][:n], strict=True), start=1):
                entry.setdefault(tid, Logprob(lp, rank))
            out[i] = entry
        return out
