"""Verify one request's proposed tokens against the target model (Leviathan et al., 2023).

Notation follows the paper (and vLLM): p = target, q = draft. Draft token x_i is accepted with
probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection the replacement is drawn from
norm(max(0, p_i - q_i)); if every draft is accepted a bonus token is drawn from p_{k+1}. The
emitted tokens are then distributed exactly as if the target had sampled them one by one.
Deterministic proposals (n-gram, greedy drafts) pass `draft_probs=None`: q is one-hot, so x_i is
accepted with probability p_i(x_i) and the residual is p_i with x_i removed (vLLM's IS_NGRAM path).
Greedy requests accept exactly while the draft equals the target's argmax.
"""

from __future__ import annotations

import torch


def sample_from(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Exact categorical sample of an unnormalised row: argmax(p / E), E ~ Exp(1)."""
    noise = torch.empty(probs.shape, dtype=torch.float32).exponential_(generator=generator)
    return int((probs.float().cpu() / noise).argmax())


def rejection_sample(
    target_probs: torch.Tensor,
    draft_token_ids: list[int],
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> list[int]:
    """target_probs: [k+1, V] (p after temperature/top-k/top-p); draft_probs: [k, V] or None.
    Returns the accepted drafts followed by one recovered or bonus token (1..k+1 tokens)."""
    k = len(draft_token_ids)
    p = target_probs.float().cpu()
    # One batched draw of the uniforms: the host loop below then touches scalars only.
    u = torch.rand(k, generator=generator).tolist()
    drafts = torch.tensor(draft_token_ids, dtype=torch.long)
    p_draft = p[torch.arange(k), drafts].tolist()
    q_draft = [1.0] * k if draft_probs is None else draft_probs.float().cpu()[torch.arange(k), drafts].tolist()
    out: list[int] = []
    for i, tok in enumerate(draft_token_ids):
        # Written as p >= u * q so q = 0 (a token the draft could not have produced) never divides.
        if q_draft[i] > 0 and p_draft[i] >= u[i] * q_draft[i]:
            out.append(tok)
            continue
        if draft_probs is None:
            residual = p[i].clone()
            residual[tok] = 0.0
        else:
            residual = (p[i] - draft_probs[i].float().cpu()).clamp_min(0.0)
        if not float(residual.sum()) > 0.0:
            residual = p[i]  # only reachable through rounding (p == q); p is then the right law
        out.append(sample_from(residual, generator))
        return out
    out.append(sample_from(p[k], generator))
    return out


def greedy_verify(target_argmax: list[int], draft_token_ids: list[int]) -> list[int]:
    """Greedy rows: accept while the draft matches the target's argmax, then emit the argmax
    (the correction at the first mismatch, or the bonus token after k matches)."""
    out: list[int] = []
    for tok, best in zip(draft_token_ids, target_argmax, strict=False):
        if tok != best:
            break
        out.append(tok)
    out.append(target_argmax[len(out)])
    return out
