"""Prompt-lookup (n-gram) proposer, vLLM's `ngram` method: no extra model.

Find the longest n-gram, prompt_lookup_max down to prompt_lookup_min tokens, that ends the
context and also occurs earlier in it; propose the tokens that followed its earliest occurrence.
Code, quoting and summarisation repeat their context, which is where this pays off.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from localengine.engine.sequence import Sequence
from localengine.spec_decode.proposer import Proposal


def propose_ngram(token_ids: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """vLLM's example: ([1, 2, 3, 4, 2, 3], min 2, max 3, k 4) -> [4, 2, 3]."""
    n_tokens = len(token_ids)
    if k <= 0 or n_tokens < min_n + 1:
        return []
    arr = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(max_n, n_tokens - 1), min_n - 1, -1):
        suffix = arr[n_tokens - n :]
        # Windows starting before the suffix itself, so at least one token follows each match.
        windows = sliding_window_view(arr[: n_tokens - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[0]) + n
            return token_ids[start : start + k]
    return []


class NgramProposer:
    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int):
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max

    def propose(self, seqs: list[Sequence], num_tokens: list[int]) -> list[Proposal]:
        return [Proposal(propose_ngram(s.token_ids, self.min_n, self.max_n, k)) for s, k in zip(seqs, num_tokens, strict=True)]

    def free(self, request_id: str) -> None:
        pass  # stateless
