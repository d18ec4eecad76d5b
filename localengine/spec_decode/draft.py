"""Draft-model proposer: a small model with the target's tokenizer and its own paged KV cache.

Each request has a shadow Sequence in the draft's own BlockManager. Before proposing, the shadow
is rolled back to the longest prefix it shares with the target's tokens (rejected drafts leave
stale K/V behind, which is simply overwritten, as in the target), then one pass catches the draft
up on every token it has not seen (the prompt the first time; afterwards the accepted drafts
and the target's correction or bonus token) and yields the first proposal; k - 1 one-token
passes yield the rest. Greedy requests get argmax drafts (q one-hot); sampled requests draw from
the draft's own distribution, whose probabilities go to the rejection sampler.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoTokenizer

from localengine.config import Config, SpeculativeConfig
from localengine.engine.block_manager import BlockManager
from localengine.engine.model_runner import ModelRunner
from localengine.engine.scheduler import ScheduledSequence
from localengine.engine.sequence import Sequence
from localengine.layers.sampler import Sampler
from localengine.spec_decode.proposer import Proposal
from localengine.spec_decode.rejection_sampler import sample_from


class DraftModelProposer:
    def __init__(self, target: Config, spec: SpeculativeConfig, num_blocks: int, tokenizer: Any,
                 target_vocab_size: int):
        assert spec.model is not None
        self.config = Config(
            model=spec.model, dtype=target.dtype, device=target.device, block_size=target.block_size,
            max_num_batched_tokens=target.max_num_batched_tokens, max_num_seqs=target.max_num_seqs,
            max_model_len=target.max_model_len, enable_prefix_caching=False,
            # As many blocks as the target: the draft is much smaller, so this is cheap, and a
            # request that fits the target's cache then (almost always) fits the draft's.
            num_kvcache_blocks=num_blocks, seed=target.seed, attention_backend=target.attention_backend,
        )
        draft_tok = AutoTokenizer.from_pretrained(str(self.config.tokenizer_path), local_files_only=True)
        if draft_tok.get_vocab() != tokenizer.get_vocab():
            raise ValueError(f"draft model {spec.model!r} does not share the target model's tokenizer")
        self.runner = ModelRunner(self.config, set())
        self.block_manager = BlockManager(num_blocks, target.block_size, enable_prefix_caching=False)
        assert self.config.max_model_len is not None
        self.max_model_len = self.config.max_model_len
        # Checkpoints pad their vocabularies differently: proposals and q live in the target's.
        self.vocab_size = target_vocab_size
        self.generator = torch.Generator(device=self.runner.device).manual_seed(target.seed + 1)
        self.seqs: dict[str, Sequence] = {}
        self.synced: dict[str, int] = {}  # target length at the last proposal: the shared prefix

    def cost_ratio(self, target_model: torch.nn.Module) -> float:
        """Starting estimate of one draft pass's cost relative to a target step: the parameter
        ratio (decode is weight-bound). The policy replaces it with measured times."""
        def count(m: torch.nn.Module) -> int:
            return sum(p.numel() for p in m.parameters())
        return count(self.runner.model) / count(target_model)

    def _shadow(self, seq: Sequence) -> Sequence:
        d = self.seqs.get(seq.request_id)
        if d is None:
            d = Sequence(seq.request_id, seq.token_ids, seq.sampling_params)
            self.seqs[seq.request_id] = d
            self.synced[seq.request_id] = seq.num_tokens
            return d
        start = self.synced[seq.request_id]
        common = start
        for a, b in zip(d.token_ids[start:], seq.token_ids[start:], strict=False):
            if a != b:
                break
            common += 1
        d.num_computed_tokens = min(d.num_computed_tokens, common)
        d.token_ids = list(seq.token_ids)
        self.synced[seq.request_id] = seq.num_tokens
        return d

    def _forward(self, batch: list[tuple[Sequence, int]]) -> torch.Tensor:
        """Run the draft over the given (shadow, new tokens) pairs; logits at each one's last token."""
        # The attention backend expects the one-token queries first (ModelRunner.execute's order).
        order = sorted(range(len(batch)), key=lambda j: (batch[j][1] != 1, batch[j][0].num_computed_tokens))
        items = [ScheduledSequence(batch[j][0], batch[j][1], batch[j][0].num_computed_tokens) for j in order]
        step = self.runner.prepare(items)
        step.logit_rows = [end - 1 for end in step.query_start_loc[1:]]
        with torch.inference_mode():
            logits = self.runner.forward(step)
        assert logits is not None
        logits = logits.float()
        for d, n in batch:
            d.num_computed_tokens += n
        unsorted = torch.empty_like(logits)
        unsorted[torch.tensor(order)] = logits
        if unsorted.shape[1] < self.vocab_size:
            pad = unsorted.new_full((unsorted.shape[0], self.vocab_size - unsorted.shape[1]), float("-inf"))
            return torch.cat([unsorted, pad], dim=1)
        return unsorted[:, : self.vocab_size]

    def propose(self, seqs: list[Sequence], num_tokens: list[int]) -> list[Proposal]:
        tokens: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        active: list[int] = []
        for i, (seq, k) in enumerate(zip(seqs, num_tokens, strict=True)):
            # Positions fed to the draft run up to num_tokens + k - 2.
            if min(k, self.max_model_len - seq.num_tokens + 1) > 0:
                active.append(i)
                self._shadow(seq)
        step = 0
        while active:
            batch, kept = [], []
            for i in active:
                d = self.seqs[seqs[i].request_id]
                n = d.num_tokens - d.num_computed_tokens
                if self.block_manager.allocate_slots(d, n):
                    batch.append((d, n))
                    kept.append(i)
                elif step == 0:
                    self.block_manager.free(d)  # no room even to catch up: start over next time
            if not batch:
                break
            logits = self._forward(batch)
            greedy = [seqs[i].sampling_params.greedy for i in kept]
            if not all(greedy):
                q = Sampler.compute_probs(logits, [seqs[i] for i in kept])
            for row, i in enumerate(kept):
                seq = seqs[i]
                if greedy[row]:
                    tok = int(logits[row].argmax())
                else:
                    tok = sample_from(q[row], seq.generator or self.generator)
                    probs[i].append(q[row])
                tokens[i].append(tok)
                self.seqs[seq.request_id].append_token(tok)
            step += 1
            limit = {i: min(num_tokens[i], self.max_model_len - seqs[i].num_tokens + 1) for i in kept}
            active = [i for i in kept if len(tokens[i]) < limit[i]]
        return [
            Proposal(t, torch.stack(p) if p else None) for t, p in zip(tokens, probs, strict=True)
        ]

    def free(self, request_id: str) -> None:
        d = self.seqs.pop(request_id, None)
        self.synced.pop(request_id, None)
        if d is not None:
            self.block_manager.free(d)
