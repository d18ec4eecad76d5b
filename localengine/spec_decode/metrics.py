"""Speculative decoding counters with vLLM's names (vllm/v1/spec_decode/metrics.py).

Prometheus appends `_total` to counters, as vLLM's exporter does. Mean acceptance length counts
the bonus token, vLLM's convention: 1 + accepted / drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter


@dataclass(slots=True)
class SpecDecodingStats:
    num_spec_tokens: int
    num_drafts: int = 0  # verification steps of one request that had proposals
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.num_spec_tokens

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for pos in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[pos] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


class SpecDecodingMetrics:
    """The engine's running totals (LLM stats) and their Prometheus counters, updated together."""

    def __init__(self, registry: CollectorRegistry, model_name: str, num_spec_tokens: int):
        labels = ["model_name"]
        self.model_name = model_name
        self.stats = SpecDecodingStats(num_spec_tokens)
        self.num_drafts = Counter("vllm:spec_decode_num_drafts", "Speculative drafts verified", labels, registry=registry)
        self.num_draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Proposed tokens verified",
                                        labels, registry=registry)
        self.num_accepted_tokens = Counter("vllm:spec_decode_num_accepted_tokens", "Proposed tokens accepted",
                                           labels, registry=registry)
        self.per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                               "Accepted tokens by position in the draft", labels + ["position"], registry=registry)
        # The labelled children, looked up once: observe_draft runs for every request every step.
        m = model_name
        self._drafts, self._draft_tokens = self.num_drafts.labels(m), self.num_draft_tokens.labels(m)
        self._accepted = self.num_accepted_tokens.labels(m)
        self._per_pos = [self.per_pos.labels(m, str(pos)) for pos in range(num_spec_tokens)]

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        self.stats.observe_draft(num_draft_tokens, num_accepted_tokens)
        self._drafts.inc()
        self._draft_tokens.inc(num_draft_tokens)
        if num_accepted_tokens:
            self._accepted.inc(num_accepted_tokens)
        for child in self._per_pos[:num_accepted_tokens]:
            child.inc()
