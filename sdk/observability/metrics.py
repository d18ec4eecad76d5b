"""Latency accounting: Prometheus histograms per team and route, plus a rolling percentile monitor.

Definitions (per request): TTFT = start → first token event; ITL = gap between consecutive token
events; TPOT = (e2e − TTFT) / (output tokens − 1); e2e = start → last byte. For a non-streaming
answer the first token is the whole body, so TTFT = e2e.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sdk.policy import AlertsPolicy, Policy, is_glob
from sdk.types import Timings, Usage

log = logging.getLogger("slipstream.metrics")

REGISTRY = CollectorRegistry(auto_describe=True)
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_GAPS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_LABELS = ("team", "route")

TTFT = Histogram("slipstream_ttft_seconds", "Time to first token", _LABELS, buckets=_SECONDS, registry=REGISTRY)
ITL = Histogram("slipstream_itl_seconds", "Time between tokens (stream events)", _LABELS, buckets=_GAPS, registry=REGISTRY)
TPOT = Histogram("slipstream_tpot_seconds", "Time per output token after the first", _LABELS, buckets=_GAPS, registry=REGISTRY)
E2E = Histogram("slipstream_e2e_seconds", "End-to-end request time", _LABELS, buckets=_SECONDS, registry=REGISTRY)
OVERHEAD = Histogram(
    "slipstream_overhead_seconds",
    "Time spent in Slipstream itself, excluding upstream time",
    ("team",),
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05),
    registry=REGISTRY,
)
# With several workers (sdk/observability/exposition.py) a gauge's page value is its mode over the
# live workers: requests in flight add up; a rolling percentile is the worst worker's; the state
# backend is up only where every worker has it.
IN_FLIGHT = Gauge("slipstream_in_flight_requests", "Requests being served", ("team",), registry=REGISTRY,
                  multiprocess_mode="livesum")
REQUESTS = Counter("slipstream_requests_total", "Answered requests", ("team", "route", "status"), registry=REGISTRY)
ERRORS = Counter("slipstream_errors_total", "Failed requests by kind", ("team", "kind"), registry=REGISTRY)
CANCELLED = Counter("slipstream_cancelled_total", "Requests whose client went away", ("team",), registry=REGISTRY)
TOKENS = Counter("slipstream_tokens_total", "Tokens by kind (input, output, cache_read, cache_write)", ("team", "route", "kind"), registry=REGISTRY)
PERCENTILE = Gauge("slipstream_latency_percentile_seconds", "Rolling percentiles", ("team", "metric", "quantile"), registry=REGISTRY,
                   multiprocess_mode="livemax")
ALERTS = Counter("slipstream_latency_alerts_total", "Rolling percentile crossed a policy threshold", ("team", "metric", "quantile"), registry=REGISTRY)
RESPONSE_CACHE = Counter(
    "slipstream_response_cache_lookups_total",
    "Response-cache lookups by outcome (miss, exact-hit, semantic-hit, error)",
    ("team", "outcome"),
    registry=REGISTRY,
)
RESPONSE_CACHE_SKIPS = Counter(
    "slipstream_response_cache_skips_total",
    "Requests the response cache neither answers nor stores, by the field that says why (sdk/cache/stage.py:skip_reason)",
    ("team", "reason"),
    registry=REGISTRY,
)
EMBEDDING_CACHE = Counter(
    "slipstream_embedding_cache_items_total",
    "Embedding input items looked up in the exact embedding cache, by outcome (hit, miss)",
    ("team", "outcome"),
    registry=REGISTRY,
)
PASSTHROUGH = Counter(
    "slipstream_passthrough_requests_total",
    "Pass-through requests (files, batches, completions) by provider, endpoint family and upstream status",
    ("team", "provider", "endpoint", "status"),
    registry=REGISTRY,
)
PASSTHROUGH_SECONDS = Histogram(
    "slipstream_passthrough_first_byte_seconds",
    "Pass-through requests: time until the provider's response headers (upload included)",
    ("team", "endpoint"),
    buckets=_SECONDS,
    registry=REGISTRY,
)
POLICY_RELOADS = Counter("slipstream_policy_reloads_total", "Policy reloads by outcome", ("outcome",), registry=REGISTRY)
STATE_BACKEND_UP = Gauge(
    "slipstream_state_backend_up", "1 while the configured state backend answers (in process: always); 0: degraded to local state", registry=REGISTRY,
    multiprocess_mode="livemin",
)
STATE_BACKEND_UP.set(1)  # in process, the backend is always there; a Redis guard sets it
STATE_ADMISSIONS = Counter(
    "slipstream_state_admissions_total",
    "Admissions through a shared state backend: checked in Redis (the request waited one round trip), granted ahead "
    "(far from every limit: charged in the background), or local (degraded)", ("how",), registry=REGISTRY,
)
ACCESS_LOG_DROPPED = Counter(
    "slipstream_access_log_dropped_total", "Access log lines dropped: standard error was not drained fast enough", ("team",), registry=REGISTRY
)
BODY_REFUSALS = Counter(
    "slipstream_body_budget_refusals_total",
    "Requests refused because the process held its budget of request bodies (--max-body-bytes-in-flight): "
    "reason share (429: the team held its share) or full (503)", ("team", "reason"), registry=REGISTRY,
)
SPEND = Counter("slipstream_spend_usd_total", "Spend in USD priced by Slipstream, as charged by this replica", ("team", "key", "model"), registry=REGISTRY)


class RouteLabels:
    """Route labels come from the policy only, so /metrics stays the same size whatever clients send.

    A route label is PROVIDER/MODEL where the policy names the model: a target's `model`, or the
    literal `match.model` of a route without wildcards. Any other model a client names (a wildcard
    route passes it through) is counted as PROVIDER/other; a cache hit keeps its `cache/` prefix.
    """

    def __init__(self, policy: Policy):
        self.providers = frozenset(policy.providers)
        self.known: set[str] = set()
        for route in policy.routes:
            literal = None if is_glob(route.match.model) else route.match.model
            for target in route.targets:
                if model := target.model or literal:
                    self.known.add(f"{target.provider}/{model}")

    def __call__(self, route: str) -> str:
        if route in self.known or route == "none":
            return route
        if route.startswith("cache/"):
            return "cache/" + self(route[6:])
        provider = route.split("/", 1)[0]
        return f"{provider}/other" if provider in self.providers else "other"


class ModelLabels:
    """Model labels a team cannot multiply: a model the policy names (a route's literal match, a
    target's `model`, a literal `pricing:` entry) keeps its name, and so do the first
    `MAX_OTHERS` other models seen; any later one is "other". A priced glob (`gpt-*`, the built-in
    `claude-opus-4-5*`) prices every name a wildcard route passes on, and each became a series of
    `slipstream_spend_usd_total` (and a field of the team's spend record) for good."""

    MAX_OTHERS = 32

    def __init__(self, policy: Policy):
        named = {route.match.model for route in policy.routes if not is_glob(route.match.model)}
        named |= {target.model for route in policy.routes for target in route.targets if target.model}
        self.named = frozenset(named | {name for name in policy.pricing if not is_glob(name)})
        self.others: set[str] = set()

    def __call__(self, model: str) -> str:
        if model in self.named or model in self.others:
            return model
        if len(self.others) < self.MAX_OTHERS:
            self.others.add(model)
            return model
        return "other"


@functools.lru_cache(maxsize=16_384)
def child(metric: Any, *values: str) -> Any:
    """`metric.labels(*values)`, looked up once per label set: `labels()` checks its arguments and
    takes a lock on every call, several times a request. Bounded: the metric keeps every child it
    made, so one looked up again after eviction is the same series."""
    return metric.labels(*values)


@dataclass(frozen=True, slots=True)
class _RouteSeries:
    """The labelled children of one (team, route), looked up once: `labels()` takes a lock each call."""

    ttft: Any
    e2e: Any
    itl: Any
    tpot: Any
    tokens: dict[str, Any]


@functools.cache
def _series(team: str, route: str) -> _RouteSeries:
    return _RouteSeries(
        ttft=TTFT.labels(team, route),
        e2e=E2E.labels(team, route),
        itl=ITL.labels(team, route),
        tpot=TPOT.labels(team, route),
        tokens={kind: TOKENS.labels(team, route, kind) for kind in ("input", "output", "cache_read", "cache_write")},
    )


def record(team: str, route: str, timings: Timings, usage: Usage, streamed: bool) -> tuple[float, float]:
    """Observe one finished request; returns (ttft, e2e) in seconds for the percentile monitor."""
    series = _series(team, route)
    e2e = time.perf_counter() - timings.start
    ttft = (timings.first_token - timings.start) if streamed and timings.first_token else e2e
    series.ttft.observe(ttft)
    series.e2e.observe(e2e)
    for gap in timings.gaps:
        series.itl.observe(gap)
    # Without reported usage (an OpenAI stream not asking include_usage) token events stand in for tokens.
    output_tokens = usage.output_tokens or timings.token_events
    if streamed and output_tokens > 1 and timings.last_token:
        series.tpot.observe((timings.last_token - timings.start - ttft) / (output_tokens - 1))
    for kind, value in (
        ("input", usage.input_tokens),
        ("output", usage.output_tokens),
        ("cache_read", usage.cache_read_tokens),
        ("cache_write", usage.cache_write_tokens),
    ):
        if value:
            series.tokens[kind].inc(value)
    return ttft, e2e


@dataclass
class _Window:
    samples: deque[float]

    def percentile(self, q: float) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class PercentileMonitor:
    """p50/p95/p99 of TTFT and e2e over the last `window` requests, checked against policy thresholds.

    Checked every `window // 10` requests rather than on each one: sorting is cheap, but not free.
    An alert fires when a threshold is first crossed and re-arms once the percentile falls back.
    """

    QUANTILES: ClassVar[dict[str, float]] = {"p50": 0.50, "p95": 0.95, "p99": 0.99}

    def __init__(self, team: str, alerts: AlertsPolicy):
        self.team = team
        self.alerts = alerts
        self.windows = {m: _Window(deque(maxlen=alerts.window)) for m in ("ttft", "e2e")}
        self._count = 0
        self._firing: set[tuple[str, str]] = set()

    def observe(self, ttft: float, e2e: float) -> None:
        self.windows["ttft"].samples.append(ttft)
        self.windows["e2e"].samples.append(e2e)
        self._count += 1
        if self._count % max(1, self.alerts.window // 10) == 0:
            self.check()

    def snapshot(self) -> dict[str, dict[str, float]]:
        return {
            metric: {name: window.percentile(q) for name, q in self.QUANTILES.items()}
            for metric, window in self.windows.items()
            if window.samples
        }

    def check(self) -> None:
        for metric, values in self.snapshot().items():
            for name, seconds in values.items():
                PERCENTILE.labels(self.team, metric, name).set(seconds)
                threshold_ms = getattr(self.alerts, f"{metric}_{name}_ms")
                key = (metric, name)
                if threshold_ms is None:
                    continue
                if seconds * 1000 > threshold_ms:
                    if key not in self._firing:
                        self._firing.add(key)
                        ALERTS.labels(self.team, metric, name).inc()
                        log.warning(
                            "team %s: %s %s is %.1f ms, above the policy threshold of %.1f ms",
                            self.team, metric, name, seconds * 1000, threshold_ms,
                        )
                else:
                    self._firing.discard(key)
