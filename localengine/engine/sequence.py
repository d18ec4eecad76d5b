"""One request's state as the scheduler and block manager see it.

Following vLLM v1 there is no prefill or decode phase: a sequence has `num_tokens` (prompt plus
generated) and `num_computed_tokens` (those whose K/V sit in the cache); every step schedules some
tokens to close that gap. A chunked prefill, a decode and a recompute after preemption are the same
thing seen from here.
"""

from __future__ import annotations

import time
from enum import Enum, auto

import torch

from localengine.outputs import Logprob, RequestMetrics
from localengine.sampling_params import SamplingParams


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    PREEMPTED = auto()
    FINISHED = auto()


class Sequence:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        prompt: str | None = None,
        cache_salt: str | None = None,
        arrival_time: float | None = None,
        device: torch.device | None = None,
    ):
        if not prompt_token_ids:
            raise ValueError("the prompt must contain at least one token")
        self.request_id = request_id
        self.prompt = prompt
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.sampling_params = sampling_params
        self.cache_salt = cache_salt
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1  # prompt tokens hit in the prefix cache at first admission
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []  # hash chain over full blocks, grown lazily
        self.num_registered_blocks = 0  # leading blocks of block_table already offered to the prefix cache
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.logprobs: list[dict[int, Logprob]] | None = [] if sampling_params.logprobs is not None else None
        self.cumulative_logprob = 0.0
        self.metrics = RequestMetrics(arrival_time=arrival_time or time.time())
        # A per-request generator makes seeded sampling independent of batch composition.
        self.generator: torch.Generator | None = None
        # Tokens proposed after the last step, verified by the next one (speculative decoding).
        self.spec_token_ids: list[int] = []
        self.spec_draft_probs: torch.Tensor | None = None  # [len(spec_token_ids), V]; None: one-hot
        self.spec_by_lookup = False  # the proposal came from prompt_lookup's n-gram lookup
        # The target's final hidden state that produced the last token, kept only for proposers
        # that draft from it (mlp_speculator).
        self.last_hidden: torch.Tensor | None = None
        if sampling_params.seed is not None:
            # On the model's device, so a seeded draw is never a host round trip.
            self.generator = torch.Generator(device=device or "cpu").manual_seed(sampling_params.seed)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def clear_spec(self) -> None:
        self.spec_token_ids = []
        self.spec_draft_probs = None


def tenant(seq: Sequence) -> str:
    """Whose request it is, for fair scheduling and caching: its cache salt up to the first ':'."""
    return (seq.cache_salt or "").partition(":")[0]
