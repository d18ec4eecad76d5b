"""What every proposer returns, and the interface the engine drives them through."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from localengine.engine.sequence import Sequence


@dataclass(slots=True)
class Proposal:
    token_ids: list[int]  # may be empty: nothing worth proposing this step
    draft_probs: torch.Tensor | None = None  # [len(token_ids), V]; None = deterministic (one-hot q)


class Proposer(Protocol):
    def propose(self, seqs: list[Sequence], num_tokens: list[int]) -> list[Proposal]:
        """Up to num_tokens[i] tokens to follow seqs[i].token_ids."""
        ...

    def free(self, request_id: str) -> None:
        """Forget a finished or aborted request (the draft model returns its KV blocks)."""
        ...
