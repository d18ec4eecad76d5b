"""Iteration-level (continuous batching) scheduler, vLLM v1's policy in miniature.

Each step hands out one token budget: running requests first (so decodes are never starved by
new prompts), then waiting ones in FCFS order. Any prompt that does not fit the remaining budget
is chunked. When the cache runs out of blocks, the most recently admitted running request is
preempted by recompute: its blocks are freed and it goes back to the head of the queue (with
prefix caching on, its recompute usually re-hits the blocks it just gave back).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from localengine.engine.block_manager import BlockManager
from localengine.engine.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class ScheduledSequence:
    seq: Sequence
    num_new_tokens: int  # tokens whose K/V this step computes, starting at seq.num_computed_tokens
    num_computed_before: int
    # Proposed tokens appended after seq.token_ids for this step only; the model runner verifies
    # them and the rejected ones are rolled back (update_after_step).
    spec_token_ids: list[int] = field(default_factory=list)
    spec_draft_probs: torch.Tensor | None = None

    @property
    def samples(self) -> bool:
        """Whether this step reaches the sequence's last token, so its logits yield a new token."""
        return self.num_computed_before + self.num_new_tokens == self.seq.num_tokens + len(self.spec_token_ids)


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    num_preempted: int = 0

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_batched_tokens: int, max_num_seqs: int,
                 max_model_len: int, num_lookahead_tokens: int = 0):
        self.block_manager = block_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        # k with speculative decoding: every allocation also reserves room for the next step's
        # proposals, so verifying them never needs a block the cache cannot give.
        self.num_lookahead_tokens = num_lookahead_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.requests: dict[str, Sequence] = {}
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        if seq.request_id in self.requests:
            raise ValueError(f"request id {seq.request_id!r} is already in use")
        if seq.num_tokens >= self.max_model_len:
            raise ValueError(f"prompt has {seq.num_tokens} tokens; this engine's max_model_len is {self.max_model_len}")
        self.requests[seq.request_id] = seq
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        bm = self.block_manager
        scheduled_ids: set[str] = set()

        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            spec = seq.spec_token_ids
            num_new = min(seq.num_tokens + len(spec) - seq.num_computed_tokens, budget)
            while not bm.allocate_slots(seq, num_new, num_lookahead_tokens=self.num_lookahead_tokens):
                victim = self.running.pop()  # the most recently admitted request
                self._preempt(victim)
                out.num_preempted += 1
                if victim is seq:
                    break
            else:
                # Proposals beyond the token budget are dropped, not deferred: they go stale.
                num_spec = max(0, seq.num_computed_tokens + num_new - seq.num_tokens)
                probs = seq.spec_draft_probs[:num_spec] if seq.spec_draft_probs is not None and num_spec else None
                out.scheduled.append(ScheduledSequence(seq, num_new, seq.num_computed_tokens, spec[:num_spec], probs))
                seq.clear_spec()
                scheduled_ids.add(seq.request_id)
                budget -= num_new
                i += 1
                continue
            break  # seq itself was preempted: everything after it already was too

        # New work is admitted only when nothing was preempted: a preemption means the cache is full.
        while self.waiting and out.num_preempted == 0 and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            computed_blocks, num_cached = bm.get_computed_blocks(seq)
            num_new = min(seq.num_tokens - num_cached, budget)
            if not bm.allocate_slots(seq, num_new, computed_blocks, self.num_lookahead_tokens):
                break
            self.waiting.popleft()
            if seq.num_cached_tokens < 0:
                seq.num_cached_tokens = num_cached
                seq.metrics.first_scheduled_time = time.time()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSequence(seq, num_new, seq.num_computed_tokens))
            budget -= num_new
        return out

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.clear_spec()
        seq.status = SequenceStatus.PREEMPTED
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def update_after_step(self, out: SchedulerOutput, num_rejected: dict[str, int] | None = None) -> None:
        """Advance computed-token counts once the model has written this step's K/V. Rejected
        speculative positions are rolled back: their K/V stay in the (still held) slots and are
        overwritten by the next step, and they are never hashed into the prefix cache."""
        for item in out.scheduled:
            rejected = num_rejected.get(item.seq.request_id, 0) if num_rejected else 0
            item.seq.num_computed_tokens = item.num_computed_before + item.num_new_tokens - rejected
            self.block_manager.cache_full_blocks(item.seq)

    def finish(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        """Retire a request (finished or aborted); its blocks return to the free list at once."""
        if seq.is_finished:
            return
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
        seq.metrics.finished_time = time.time()
        seq.clear_spec()
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        self.requests.pop(seq.request_id, None)
