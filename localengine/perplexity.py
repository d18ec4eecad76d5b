"""Perplexity of an engine's model over a token sequence: how much quantized weights (or a quantized
KV cache) cost in quality, measured through the engine's own forward pass.

Sliding windows, as Hugging Face's perplexity guide does it: each window is `window` tokens, the
next starts `stride` tokens later, and only tokens no earlier window scored are scored, so every
token past the first window is predicted from at least `window - stride` tokens of context.
Each window is one prefill into the engine's KV cache, which must be idle (its blocks are borrowed
for the pass; the prefix cache is forgotten first so no later request can hit what they held).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from localengine.engine.input_batch import StepInputs
from localengine.llm import LLM


@dataclass(frozen=True, slots=True)
class Perplexity:
    perplexity: float
    mean_nll: float  # nats per scored token
    num_scored: int
    # The model's greedy choice at each scored position, given the text before it: two engines'
    # lists compared position by position are their teacher-forced greedy agreement.
    argmax: tuple[int, ...] = ()


@torch.inference_mode()
def perplexity(llm: LLM, token_ids: list[int], window: int = 512, stride: int = 256) -> Perplexity:
    """exp(mean negative log-likelihood) of every token after the first, each given up to `window`
    preceding tokens (at least `window - stride` past the first window)."""
    engine = llm.llm_engine
    if engine.has_unfinished_requests():
        raise RuntimeError("perplexity borrows the KV cache: run it while the engine has no requests")
    if engine.config.tensor_parallel_size > 1:
        raise NotImplementedError("perplexity runs one process's forward pass: tensor_parallel_size must be 1")
    runner = engine.model_runner
    block_size = runner.block_size
    max_len = engine.config.max_model_len
    assert max_len is not None
    if not 0 < stride <= window <= min(max_len, runner.num_kvcache_blocks * block_size):
        raise ValueError(f"need 0 < stride <= window <= the context and the KV cache ({max_len} tokens)")
    llm.reset_prefix_cache()
    total_nll, scored, start = 0.0, 0, 0
    argmax: list[int] = []
    while True:
        ids = token_ids[start:start + window]
        first_new = 1 if start == 0 else window - stride  # tokens before it were scored by an earlier window
        if len(ids) > first_new:
            n = len(ids)
            blocks = -(-n // block_size)
            step = StepInputs(
                input_ids=torch.tensor(ids, dtype=torch.long), positions=torch.arange(n),
                slot_mapping=torch.arange(n), block_tables=torch.from_numpy(np.arange(blocks, dtype=np.int32)[None]),
                query_start_loc=[0, n], seq_lens=[n], num_decodes=0, max_query_len=n,
                logit_rows=list(range(first_new - 1, n - 1)))
            logits = runner.forward(step)
            assert logits is not None
            targets = torch.tensor(ids[first_new:], device=logits.device)
            logprobs = torch.log_softmax(logits.float(), dim=-1).gather(1, targets[:, None])
            total_nll -= logprobs.sum().item()
            argmax.extend(logits.argmax(dim=-1).tolist())
            scored += len(targets)
        if start + window >= len(token_ids):
            break
        start += stride
    if not scored:
        raise ValueError("need at least two tokens")
    mean = total_nll / scored
    return Perplexity(math.exp(mean), mean, scored, tuple(argmax))
