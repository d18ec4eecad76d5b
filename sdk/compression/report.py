"""Prometheus metrics of the compression stage (in sdk.observability.metrics.REGISTRY, served at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from sdk.observability.metrics import REGISTRY

TOKENS = Counter(
    "slipstream_compression_tokens_total",
    "Message tokens (tiktoken cl100k) of requests seen by the compression stage, before and after it",
    ("team", "when"),
    registry=REGISTRY,
)
REQUESTS = Counter(
    "slipstream_compression_requests_total",
    "Requests seen by the compression stage, by outcome (compressed, unchanged, refused, error)",
    ("team", "outcome"),
    registry=REGISTRY,
)
REFUSALS = Counter(
    "slipstream_compression_refusals_total",
    "Pieces of material left whole because pruning them would drop a protected item",
    ("team",),
    registry=REGISTRY,
)
PIECES = Counter(
    "slipstream_compression_pieces_total",
    "Pieces of material pruned, by place (system, earlier_turns, latest_turn)",
    ("team", "place"),
    registry=REGISTRY,
)
LEFT = Counter(
    "slipstream_compression_left_total",
    "Pieces of material left whole, by place and reason (no_question, no_lead_in, cached_prefix, protected_items)",
    ("team", "place", "reason"),
    registry=REGISTRY,
)
HISTORY = Counter(
    "slipstream_compression_history_total",
    "History compaction events (scheduled, summarized, refused by the team's limits or budget, failed, applied)",
    ("team", "event"),
    registry=REGISTRY,
)
SECONDS = Histogram(
    "slipstream_compression_seconds",
    "Time the compression stage spent on a request",
    ("team",),
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
    registry=REGISTRY,
)
