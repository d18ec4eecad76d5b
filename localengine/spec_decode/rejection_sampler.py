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
    """Exact categorical sample of an unnormalised row: argmax(p / E), E ~ Exp(1), on p's device."""
    noise = torch.empty(probs.shape, dtype=torch.float32, device=probs.device).exponential_(generator=generator)
    return int((probs.float() / noise).argmax())


def rejection_sample(
    target_probs: torch.Tensor,
    draft_token_ids: list[int],
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> list[int]:
    """target_probs: [k+1, V] (p after temperature/top-k/top-p); draft_probs: [k, V] or None.
    Returns the accepted drafts followed by one recovered or bonus token (1..k+1 tokens).
    Everything stays on the probabilities' device; the number accepted is the one host sync."""
    k = len(draft_token_ids)
    p = target_probs.float()
    rows = torch.arange(k, device=p.device)
    drafts = torch.tensor(draft_token_ids, dtype=torch.long, device=p.device)
    # One batched draw of the uniforms, then the first rejection found without a loop.
    u = torch.rand(k, generator=generator, device=p.device)
    p_draft = p[rows, drafts]
    q_draft = torch.ones_like(p_draft) if draft_probs is None else draft_probs.float()[rows, drafts]
    # Written as p >= u * q so q = 0 (a token the draft could not have produced) never divides.
    accepted = (q_draft > 0) & (p_draft >= u * q_draft)
    num_accepted = int(accepted.int().cumprod(0).sum())
    if num_accepted == k:
        return draft_token_ids + [sample_from(p[k], generator)]
    i = num_accepted
    if draft_probs is None:
        residual = p[i].clone()
        residual[drafts[i]] = 0.0
    else:
        residual = (p[i] - draft_probs[i].float()).clamp_min(0.0)
    if not float(residual.sum()) > 0.0:
        residual = p[i]  # only reachable through rounding (p == q); p is then the right law
    return draft_token_ids[:i] + [sample_from(residual, generator)]


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
