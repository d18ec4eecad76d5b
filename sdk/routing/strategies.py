"""Which target of a route to try first: the order strategies and the per-target statistics they read.

- priority: the order written in the policy (a fallback chain).
- weighted: a weighted random order (each pick without replacement, proportional to `weight`).
- lowest_latency: by EWMA of time to first byte, inflated by the EWMA error rate; targets with no
  measurement yet go first so that every target gets measured.
- least_busy: fewest requests in flight (streams count until they end); ties keep policy order.
- prefix_affinity: requests sharing a leading prompt block go to the same target, with bounded
  load (sdk/routing/affinity.py); for groups of replicas that keep a prefix cache.

Whatever the strategy, the rest of the route stays behind the first pick as fallbacks.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sdk.policy import Route, Target
from sdk.routing.affinity import PrefixOwners, affinity_order

_ALPHA = 0.2  # EWMA weight of the newest sample: about the last ten requests matter
_ERROR_PENALTY = 4.0  # a target failing every request scores as if five times slower
# The hedge delay is the p95 of the last _P95_SAMPLES first-byte times. A long window keeps one burst
# of correlated slow samples (a pause on our side delays every request in flight at once) under 5%
# of it; the quantile is re-sorted only every _P95_REFRESH new samples.
_P95_SAMPLES = 1000
_P95_REFRESH = 25


def target_key(target: Target, model: str) -> str:
    """Identity of a target for breakers and statistics: PROVIDER/MODEL as it is sent upstream."""
    return f"{target.provider}/{target.model or model}"


@dataclass(slots=True)
class TargetStats:
    ttfb_ewma_s: float | None = None
    error_ewma: float = 0.0
    in_flight: int = 0
    recent_ttfb_s: deque[float] = field(default_factory=lambda: deque(maxlen=_P95_SAMPLES))
    _p95_s: float | None = field(default=None, init=False, repr=False)
    _p95_age: int = field(default=0, init=False, repr=False)  # samples since _p95_s was computed

    def success(self, ttfb_s: float) -> None:
        self.ttfb_ewma_s = ttfb_s if self.ttfb_ewma_s is None else self.ttfb_ewma_s + _ALPHA * (ttfb_s - self.ttfb_ewma_s)
        self.error_ewma *= 1 - _ALPHA
        self.recent_ttfb_s.append(ttfb_s)
        self._p95_age += 1

    def failure(self) -> None:
        self.error_ewma += _ALPHA * (1 - self.error_ewma)

    def p95_ttfb_s(self, min_samples: int) -> float | None:
        if len(self.recent_ttfb_s) < min_samples:
            return None
        if self._p95_s is None or self._p95_age >= _P95_REFRESH:
            ordered = sorted(self.recent_ttfb_s)
            self._p95_s, self._p95_age = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], 0
        return self._p95_s

    @property
    def latency_score(self) -> float:
        if self.ttfb_ewma_s is None:
            return -1.0  # unmeasured: try it so that it gets measured
        return self.ttfb_ewma_s * (1 + _ERROR_PENALTY * self.error_ewma)


class StatsBook:
    """Statistics of every target this router has used, keyed by `target_key`, and which target
    answered which prompt prefixes (for prefix_affinity)."""

    def __init__(self) -> None:
        self._stats: dict[str, TargetStats] = {}
        self.prefix_owners = PrefixOwners()

    def __getitem__(self, key: str) -> TargetStats:
        stats = self._stats.get(key)
        if stats is None:
            stats = self._stats[key] = TargetStats()
        return stats

    def keys(self) -> list[str]:
        """The targets this router has tried (the status page lists their breakers)."""
        return list(self._stats)


# (targets, model, statistics, prompt prefix hashes: only computed for prefix_affinity routes)
Order = Callable[[Sequence[Target], str, StatsBook, list[bytes]], list[Target]]


def _priority(targets: Sequence[Target], model: str, book: StatsBook, prefix: list[bytes]) -> list[Target]:
    return list(targets)


def _weighted(targets: Sequence[Target], model: str, book: StatsBook, prefix: list[bytes]) -> list[Target]:
    left, order = list(targets), []
    while left:
        pick = random.choices(range(len(left)), weights=[t.weight for t in left])[0]
        order.append(left.pop(pick))
    return order


def _lowest_latency(targets: Sequence[Target], model: str, book: StatsBook, prefix: list[bytes]) -> list[Target]:
    return sorted(targets, key=lambda t: book[target_key(t, model)].latency_score)


def _least_busy(targets: Sequence[Target], model: str, book: StatsBook, prefix: list[bytes]) -> list[Target]:
    return sorted(targets, key=lambda t: book[target_key(t, model)].in_flight)


def _prefix_affinity(targets: Sequence[Target], model: str, book: StatsBook, prefix: list[bytes]) -> list[Target]:
    keys = [target_key(t, model) for t in targets]
    order = affinity_order(keys, [book[k].in_flight for k in keys], prefix, book.prefix_owners)
    return [targets[i] for i in order]


STRATEGIES: dict[str, Order] = {
    "priority": _priority,
    "weighted": _weighted,
    "lowest_latency": _lowest_latency,
    "least_busy": _least_busy,
    "prefix_affinity": _prefix_affinity,
}


def ordered_targets(route: Route, model: str, book: StatsBook, prefix: list[bytes]) -> list[Target]:
    return STRATEGIES[route.strategy](route.targets, model, book, prefix)
