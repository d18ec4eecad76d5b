"""Adaptive speculation: how many tokens to propose for each request, or none.

With per-token acceptance rate a, k proposals yield E(k) = (1 - a^(k+1)) / (1 - a) tokens per
target step (Leviathan et al., Eq. 1) at a cost of about 1 + k * (c + v) plain decode steps, where c
is one proposed token's cost (0 for n-gram lookup) and v the verifier's marginal cost per extra
position; c starts from the proposer's static estimate and then follows the measured time of
proposing relative to the target step. k maximises E(k) / cost(k). When even the best k does not
clearly win (E / cost < 1.1: break-even plus a margin for costs the model leaves out) the request
stops speculating for a while and then probes again with one token (also the first thing a
request does when the prior says no: costs and acceptance are only known once measured).
Speculation is also off for short outputs (the draft's catch-up prefill is not repaid) and for
large batches, where decode is no longer memory-bound and verifying k extra positions costs as
much as generating them (vLLM measured 1.4-1.8x slowdowns at high QPS; on the 2-core CPU
n-gram speculation stops paying at a batch of 8).
"""

from __future__ import annotations

from dataclasses import dataclass

from localengine.config import SpeculativeConfig
from localengine.engine.sequence import Sequence

VERIFY_COST_PER_TOKEN = 0.1  # extra positions in a small verification pass cost ~10% of a decode
PRIOR_ACCEPTED, PRIOR_TRIALS = 3.0, 5.0  # an optimistic a = 0.6 until measured
DECAY = 0.9  # older drafts count less: acceptance changes along a sequence
COST_DECAY = 0.95  # the measured draft cost is smoothed over ~20 steps
# A measurement counts at most this many times the running estimate (plus COST_FLOOR): on a shared
# machine a lookup preempted for a time slice measures as several target steps, and one such
# reading used to push n-gram's cost past break-even, switching speculation off for hundreds of
# steps (its estimate moves only on probes). A real increase is still followed, within ~50 readings.
COST_OUTLIER, COST_FLOOR = 2.0, 0.01
# Required modelled gain: the model leaves out the draft's catch-up prefill, longer verification
# queries and host-side verification, which cost the demo pair on CPU roughly this much.
MIN_EXPECTED_SPEEDUP = 1.1
COOLDOWN_STEPS = 32  # steps without speculation before probing a below-break-even request again


@dataclass(slots=True)
class RequestSpecState:
    accepted: float = PRIOR_ACCEPTED
    trials: float = PRIOR_TRIALS
    cooldown: int = 0
    probe: bool = True  # the next below-break-even decision still proposes one token, to measure

    @property
    def acceptance(self) -> float:
        return self.accepted / self.trials


def expected_speedup(a: float, k: int, draft_cost: float) -> float:
    tokens = k + 1 if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)
    return tokens / (1.0 + k * (draft_cost + VERIFY_COST_PER_TOKEN))


class SpeculationPolicy:
    def __init__(self, config: SpeculativeConfig, max_model_len: int, draft_cost: float):
        self.config = config
        self.max_model_len = max_model_len
        self.draft_cost = draft_cost
        self.states: dict[str, RequestSpecState] = {}

    def num_tokens(self, seq: Sequence, batch_size: int) -> int:
        """Proposals to make for `seq` now (0: decode normally this step)."""
        cfg, params = self.config, seq.sampling_params
        # Verification returns no logprobs, cannot ban stop tokens below min_tokens and samples
        # from the model's distribution before penalties and biases.
        if params.logprobs is not None or seq.num_output_tokens < params.min_tokens or params.shapes_logits:
            return 0
        # Proposals past the request's last token would be thrown away.
        limit = self.max_model_len - seq.num_tokens - 1
        if params.max_tokens is not None:
            limit = min(limit, params.max_tokens - seq.num_output_tokens - 1)
        k = min(cfg.num_speculative_tokens, limit)
        if k <= 0 or not cfg.adaptive:
            return max(k, 0)
        if (params.max_tokens is not None and params.max_tokens < cfg.min_output_tokens) or (
            cfg.disable_by_batch_size is not None and batch_size >= cfg.disable_by_batch_size
        ):
            return 0
        state = self.states.setdefault(seq.request_id, RequestSpecState())
        if state.cooldown > 0:
            state.cooldown -= 1
            state.probe = state.cooldown == 0
            return 0
        a = state.acceptance
        best = max(range(1, k + 1), key=lambda n: expected_speedup(a, n, self.draft_cost))
        if expected_speedup(a, best, self.draft_cost) < MIN_EXPECTED_SPEEDUP:
            if state.probe:
                state.probe = False
                return 1
            state.cooldown = COOLDOWN_STEPS
            return 0
        state.probe = False
        return best

    def observe_cost(self, draft_cost: float) -> None:
        draft_cost = min(draft_cost, COST_OUTLIER * self.draft_cost + COST_FLOOR)
        self.draft_cost = COST_DECAY * self.draft_cost + (1.0 - COST_DECAY) * draft_cost

    def observe(self, request_id: str, num_draft: int, num_accepted: int) -> None:
        state = self.states.get(request_id)
        if state is None or num_draft == 0:
            return
        # Drafts stop at the first rejection: n accepted of k is n successes in n (+1 if rejected) trials.
        state.accepted = DECAY * state.accepted + num_accepted
        state.trials = DECAY * state.trials + num_accepted + (num_accepted < num_draft)

    def free(self, request_id: str) -> None:
        self.states.pop(request_id, None)
