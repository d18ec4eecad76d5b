"""Iteration-level (continuous batching) scheduler, vLLM v1's policy in miniature.

Each step hands out one token budget: running requests first (so decodes are never starved by
new prompts), then waiting ones in FCFS order. Any prompt that does not fit the remaining budget
is chunked. When the cache runs out of blocks, the most recently admitted running request of the
tenant running most is preempted by recompute: its blocks are freed and it goes back to the head of
the queue (with prefix caching on, its recompute usually re-hits the blocks it just gave back).

Tenants share the engine fairly: a request's tenant is its `cache_salt` up to the first ':' (the
gateway salts every team's requests so: sdk/providers/local.py:team_cache_salt). When more than one
tenant waits, a free place goes to the earliest waiting request of the tenant with the fewest
running, so one tenant's queue of a thousand requests does not make another's wait behind all of it.
Each tenant's share is max_num_seqs / the tenants running or waiting (at least one place): when
every place is taken and a tenant waits below its share, the most recently admitted request of the
tenant furthest above its share is preempted for it, so long generations holding every place do not
make another tenant wait until they finish (vLLM's priority policy preempts so for a higher priority).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field

import torch

from localengine.engine.block_manager import BlockManager
from localengine.engine.sequence import Sequence, SequenceStatus, tenant


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
        self._waiting_tenants: Counter[str] = Counter()  # tenant -> its sequences in `waiting`
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
        self._waiting_tenants[tenant(seq)] += 1

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        bm = self.block_manager
        scheduled_ids: set[str] = set()
        self._make_room_for_a_tenant_below_its_share()

        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            spec = seq.spec_token_ids
            num_new = min(seq.num_tokens + len(spec) - seq.num_computed_tokens, budget)
            while not bm.allocate_slots(seq, num_new, num_lookahead_tokens=self.num_lookahead_tokens):
                victim = self._victim(i)
                self.running.remove(victim)
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
            # seq itself was preempted: running[i] is the next one

        # New work is admitted only when nothing was preempted: a preemption means the cache is full.
        while self.waiting and out.num_preempted == 0 and budget > 0 and len(self.running) < self.max_num_seqs:
            index = self._next_waiting()
            seq = self.waiting[index]
            computed_blocks, num_cached = bm.get_computed_blocks(seq)
            num_new = min(seq.num_tokens - num_cached, budget)
            if not bm.allocate_slots(seq, num_new, computed_blocks, self.num_lookahead_tokens):
                break
            del self.waiting[index]
            self._left_waiting(seq)
            if seq.num_cached_tokens < 0:
                seq.num_cached_tokens = num_cached
                seq.metrics.first_scheduled_time = time.time()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSequence(seq, num_new, seq.num_computed_tokens))
            budget -= num_new
        return out

    def _victim(self, start: int) -> Sequence:
        """Which request to preempt for room, among those not yet scheduled this step (running[start:]):
        the most recently admitted of the tenant running most (with one tenant, the last one)."""
        running = Counter(tenant(seq) for seq in self.running)
        index = max(range(start, len(self.running)), key=lambda k: (running[tenant(self.running[k])], k))
        return self.running[index]

    def _make_room_for_a_tenant_below_its_share(self) -> None:
        """When every place is taken and the tenant to admit next runs below its share, preempt the
        most recently admitted request of the tenant furthest above its share."""
        if len(self.running) < self.max_num_seqs or not self.waiting:
            return
        running = Counter(tenant(seq) for seq in self.running)
        share = max(1, self.max_num_seqs // len(running.keys() | self._waiting_tenants.keys()))
        if running[tenant(self.waiting[self._next_waiting()])] >= share:
            return
        most = max(running, key=running.__getitem__)
        if running[most] <= share:
            return
        victim = next(seq for seq in reversed(self.running) if tenant(seq) == most)
        self.running.remove(victim)
        self._preempt(victim)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.clear_spec()
        seq.status = SequenceStatus.PREEMPTED
        self.waiting.appendleft(seq)
        self._waiting_tenants[tenant(seq)] += 1
        self.num_preemptions += 1

    def _next_waiting(self) -> int:
        """The index in `waiting` of the sequence to admit next: the head when one tenant alone waits;
        else the earliest of the tenant running fewest (a tenant's preempted requests are its earliest)."""
        head = self.waiting[0]
        if len(self._waiting_tenants) < 2:
            return 0
        running = Counter(tenant(seq) for seq in self.running)
        best, least = 0, running[tenant(head)]
        seen = {tenant(head)}
        for index, seq in enumerate(self.waiting):
            if least == 0 or len(seen) == len(self._waiting_tenants):
                break
            name = tenant(seq)
            if name in seen:
                continue
            seen.add(name)
            if running[name] < least:
                best, least = index, running[name]
        return best

    def _left_waiting(self, seq: Sequence) -> None:
        name = tenant(seq)
        self._waiting_tenants[name] -= 1
        if self._waiting_tenants[name] <= 0:
            del self._waiting_tenants[name]

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
            self._left_waiting(seq)
        self.block_manager.free(seq)
        self.requests.pop(seq.request_id, None)
