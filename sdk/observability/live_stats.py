"""The last minutes of traffic, per team and route, for the status page (`GET /ui`, gateway/ui/).

A ring of 10-second buckets per (team, route label): requests, errors, cancellations, response-cache
hits, prompt-cache tokens read against expected and the probable causes of misses, compression's
tokens before and after, and TTFT / end-to-end histograms. It is fed by the metrics stage at the
same point as the access log and the trace span (sdk/observability/stage.py), so it counts what they
count; it holds data only, nothing here decides anything.

Latencies go into log-spaced bins 10% wide (0.1 ms to ~5 hours), so a percentile read from a
bucket is within ~5% of the exact one, and a bucket's size does not grow with traffic: recording
costs a few list and array increments, and reading ten minutes of a route is a few numpy sums.

Off until `enable()`: the proxy turns it on; the drop-in SDK leaves it off (an application has no
page to show it on). Each process keeps its own; the workers of `slipstream serve --workers N` add
up theirs for a page (sdk/observability/live_workers.py), replicas on other hosts do not. Route labels come from the policy (sdk/observability/metrics.py:RouteLabels),
so the number of series is bounded whatever clients send; miss causes are capped per bucket.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from sdk.pipeline import RequestContext
from sdk.promptcache.optimizer import MISS_TOLERANCE
from sdk.types import Usage

BUCKET_S = 10
BUCKETS = 60  # ten minutes
QUANTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
MAX_CAUSES = 32  # distinct miss causes kept per bucket; the rest are counted as "other"

# Per-bucket counters, one column each.
COUNTERS = (
    "requests", "errors", "cancelled", "exact_hits", "semantic_hits",
    "input_tokens", "cache_read_tokens", "expected_read_tokens", "compression_before", "compression_after",
)
(REQUESTS, ERRORS, CANCELLED, EXACT_HITS, SEMANTIC_HITS,
 INPUT_TOKENS, CACHE_READ_TOKENS, EXPECTED_READ_TOKENS, COMPRESSION_BEFORE, COMPRESSION_AFTER) = range(len(COUNTERS))

_MIN_S = 1e-4  # the first bin holds everything up to 0.1 ms
_GROWTH = 1.1
_BINS = 200  # up to 0.1 ms * 1.1**200 ≈ 5.3 hours
_LOG_GROWTH = math.log(_GROWTH)
BIN_VALUES_MS = _MIN_S * 1000 * _GROWTH ** (np.arange(_BINS) + 0.5)  # each bin's geometric middle


def bin_of(seconds: float) -> int:
    if seconds <= _MIN_S:
        return 0
    return min(_BINS - 1, int(math.log(seconds / _MIN_S) / _LOG_GROWTH))


@dataclass(frozen=True)
class Bucket:
    """A copy of one bucket, its histograms dense: what a snapshot holds."""

    counts: tuple[int, ...]
    ttft: np.ndarray  # samples per bin
    e2e: np.ndarray
    causes: Counter[str]


def dense(sparse: dict[int, int]) -> np.ndarray:
    dense = np.zeros(_BINS, np.int64)
    if sparse:
        dense[list(sparse)] = list(sparse.values())
    return dense


class _Series:
    """One (team, route)'s ring: slot `epoch % BUCKETS` holds bucket `epoch` (epoch = time // bucket_s)."""

    __slots__ = ("causes", "closed", "counts", "e2e", "epochs", "ttft")

    def __init__(self) -> None:
        self.epochs = [-1] * BUCKETS
        self.counts = [[0] * len(COUNTERS) for _ in range(BUCKETS)]
        self.ttft: list[dict[int, int]] = [{} for _ in range(BUCKETS)]  # bin -> samples, sparse
        self.e2e: list[dict[int, int]] = [{} for _ in range(BUCKETS)]
        self.causes: list[Counter[str]] = [Counter() for _ in range(BUCKETS)]
        # Copies of buckets whose time has passed (nothing records into them any more): each is
        # copied once, so a snapshot copies only the bucket still filling.
        self.closed: dict[int, Bucket] = {}

    def copy(self, slot: int) -> Bucket:
        return Bucket(tuple(self.counts[slot]), dense(self.ttft[slot]), dense(self.e2e[slot]), Counter(self.causes[slot]))

    def slot(self, epoch: int) -> int:
        slot = epoch % BUCKETS
        if self.epochs[slot] != epoch:  # a bucket from a lap ago: start it afresh
            self.epochs[slot] = epoch
            self.counts[slot] = [0] * len(COUNTERS)
            self.ttft[slot] = {}
            self.e2e[slot] = {}
            self.causes[slot] = Counter()
        return slot


@dataclass(frozen=True)
class RouteWindow:
    """One (team, route) over the window: per-bucket series (oldest first) and the window's totals."""

    team: str
    route: str
    counts: dict[str, list[int]]  # COUNTERS name -> per-bucket values
    ttft_ms: dict[str, list[float | None]]  # p50/p95/p99 per bucket (None: no sample in that bucket)
    e2e_ms: dict[str, list[float | None]]
    totals: dict[str, int]  # COUNTERS summed over the window
    ttft_total_ms: dict[str, float | None]  # p50/p95/p99 over the whole window
    e2e_total_ms: dict[str, float | None]
    causes: Counter[str] = field(default_factory=Counter)  # prompt-cache miss causes over the window


@dataclass(frozen=True)
class Window:
    bucket_s: int
    times: list[float]  # each bucket's start (Unix seconds), oldest first
    routes: list[RouteWindow]

    def teams(self) -> list[str]:
        return sorted({r.team for r in self.routes})

    def of_team(self, team: str) -> list[RouteWindow]:
        return [r for r in self.routes if r.team == team]


class LiveStats:
    def __init__(self, bucket_s: int = BUCKET_S, clock: Callable[[], float] = time.time):
        self.bucket_s = bucket_s  # 10 s on the proxy; shorter in the browser test, so a few seconds of traffic draw a line
        self._clock = clock
        self._series: dict[tuple[str, str], _Series] = {}
        self.recorded = 0  # requests recorded so far (a worker publishes its buckets only when it moved)

    def record(
        self,
        ctx: RequestContext,
        route: str,
        status: int | str,
        usage: Usage | None = None,
        latency: tuple[float, float] | None = None,
    ) -> None:
        """One ended request: `status` as in the access log (HTTP status, `stream_error`, `cancelled`),
        `route` its bounded label, `latency` (TTFT, e2e) in seconds for an answered request."""
        self.recorded += 1
        key = (ctx.team, route)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series()
        slot = series.slot(int(self._clock() // self.bucket_s))
        counts = series.counts[slot]
        counts[REQUESTS] += 1
        if status == "cancelled":
            counts[CANCELLED] += 1
        elif status == "stream_error" or (isinstance(status, int) and status >= 400):
            counts[ERRORS] += 1
        if ctx.cache_status == "exact-hit":
            counts[EXACT_HITS] += 1
        elif ctx.cache_status == "semantic-hit":
            counts[SEMANTIC_HITS] += 1
        elif usage is not None and usage.total_input_tokens:  # what the provider read, on answers it gave
            read, expected = usage.cache_read_tokens, ctx.prompt_cache.expected_read
            counts[INPUT_TOKENS] += usage.total_input_tokens
            counts[CACHE_READ_TOKENS] += read
            counts[EXPECTED_READ_TOKENS] += expected
            cause = ctx.prompt_cache.miss_cause or ("expired_or_evicted" if expected and read < expected * MISS_TOLERANCE else "")
            if cause:
                causes = series.causes[slot]
                causes["other" if cause not in causes and len(causes) >= MAX_CAUSES else cause] += 1
        if ctx.compression is not None:
            counts[COMPRESSION_BEFORE] += ctx.compression.before
            counts[COMPRESSION_AFTER] += ctx.compression.after
        if latency is not None:
            for histogram, seconds in ((series.ttft[slot], latency[0]), (series.e2e[slot], latency[1])):
                found = bin_of(seconds)
                histogram[found] = histogram.get(found, 0) + 1

    def snapshot(self) -> Snapshot:
        """Copies of the buckets still in the window: cheap, taken on the loop that records, so
        `Snapshot.window()` can do the arithmetic in a worker thread."""
        last = int(self._clock() // self.bucket_s)
        first = last - BUCKETS + 1
        copied = []
        for (team, route), series in sorted(self._series.items()):
            rows = []
            for row, epoch in enumerate(range(first, last + 1)):
                slot = epoch % BUCKETS
                if series.epochs[slot] != epoch:
                    continue
                if epoch == last:
                    rows.append((row, series.copy(slot)))
                else:
                    bucket = series.closed.get(epoch)
                    if bucket is None:
                        bucket = series.closed[epoch] = series.copy(slot)
                    rows.append((row, bucket))
            for epoch in [epoch for epoch in series.closed if epoch < first]:
                del series.closed[epoch]
            if rows:
                copied.append(SeriesCopy(team, route, rows))
        return Snapshot(self.bucket_s, last, copied)

    def window(self) -> Window:
        return self.snapshot().window()


@dataclass(frozen=True)
class SeriesCopy:
    team: str
    route: str
    rows: list[tuple[int, Bucket]]  # (row in the window, its bucket)


@dataclass(frozen=True)
class Snapshot:
    bucket_s: int
    last: int  # the current bucket's epoch
    series: list[SeriesCopy]

    def window(self) -> Window:
        """The last BUCKETS buckets (the current one included) of every series with traffic in them."""
        routes = []
        for copy in self.series:
            counts = np.zeros((BUCKETS, len(COUNTERS)), np.int64)
            # rows 0..BUCKETS-1: TTFT per bucket, BUCKETS: TTFT over the window; then the same for e2e
            histograms = np.zeros((2 * (BUCKETS + 1), _BINS), np.int64)
            causes: Counter[str] = Counter()
            for row, bucket in copy.rows:
                counts[row] = bucket.counts
                histograms[row] = bucket.ttft
                histograms[BUCKETS + 1 + row] = bucket.e2e
                causes.update(bucket.causes)
            histograms[BUCKETS] = histograms[:BUCKETS].sum(axis=0)
            histograms[-1] = histograms[BUCKETS + 1:-1].sum(axis=0)
            values = percentiles(histograms)
            routes.append(RouteWindow(
                team=copy.team,
                route=copy.route,
                counts={name: counts[:, i].tolist() for i, name in enumerate(COUNTERS)},
                ttft_ms={q: v[:BUCKETS] for q, v in values.items()},
                e2e_ms={q: v[BUCKETS + 1:-1] for q, v in values.items()},
                totals={name: int(counts[:, i].sum()) for i, name in enumerate(COUNTERS)},
                ttft_total_ms={q: v[BUCKETS] for q, v in values.items()},
                e2e_total_ms={q: v[-1] for q, v in values.items()},
                causes=causes,
            ))
        first = self.last - BUCKETS + 1
        return Window(self.bucket_s, [float((first + row) * self.bucket_s) for row in range(BUCKETS)], routes)


def percentiles(histograms: np.ndarray) -> dict[str, list[float | None]]:
    """p50/p95/p99 in ms of each row of `histograms` (rows: buckets, columns: bins); None for an empty row.
    Nearest rank: the value of the bin holding the ceil(q * n)-th sample."""
    cumulative = np.cumsum(histograms, axis=1)
    totals = cumulative[:, -1]
    out: dict[str, list[float | None]] = {}
    for name, q in QUANTILES.items():
        ranks = np.maximum(1, np.ceil(q * totals))
        index = (cumulative >= ranks[:, None]).argmax(axis=1)
        values = np.round(BIN_VALUES_MS[index], 2).tolist()
        out[name] = [v if n else None for v, n in zip(values, totals.tolist(), strict=True)]
    return out


def merge(routes: Iterable[RouteWindow]) -> tuple[dict[str, list[int]], dict[str, int], Counter[str]]:
    """A team's routes summed: per-bucket counters, window totals and miss causes."""
    series: dict[str, list[int]] = {}
    totals: dict[str, int] = dict.fromkeys(COUNTERS, 0)
    causes: Counter[str] = Counter()
    for route in routes:
        for name, values in route.counts.items():
            series[name] = [a + b for a, b in zip(series[name], values, strict=True)] if name in series else list(values)
            totals[name] += route.totals[name]
        causes.update(route.causes)
    return series, totals, causes


_recorder: LiveStats | None = None


def enable(recorder: LiveStats | None = None) -> LiveStats:
    """Start recording in this process (idempotent) into `recorder`, or into the one already there
    (a new 10-second one if none); returns the process's recorder."""
    global _recorder
    if recorder is not None or _recorder is None:
        _recorder = recorder or LiveStats()
    return _recorder


def recorder() -> LiveStats | None:
    return _recorder


def record(ctx: RequestContext, route: str, status: int | str, usage: Usage | None = None,
           latency: tuple[float, float] | None = None) -> None:
    """The metrics stage's call: a no-op (one global read) until `enable()`."""
    if _recorder is not None:
        _recorder.record(ctx, route, status, usage, latency)
