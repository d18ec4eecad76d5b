"""What the proxy refuses before it knows who is asking: counted, and logged without letting a flood
of refusals flood the log.

Two counters on `/metrics`: `slipstream_auth_failures_total{door, reason}` (a bad or missing team key
on the API, a wrong admin key on `/metrics` or `/ui`) and `slipstream_edge_refusals_total{reason}`
(connections the HTTP layer closed before the app saw a request: gateway/edge.py). Their labels are
fixed words, never a key or an address, so an attacker cannot grow the series.

The log lines name the client address and the reason; `RateLimitedLog` writes at most one line per
source per interval, and the next line from that source says how many it left out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from sdk.observability.metrics import REGISTRY

AUTH_FAILURES = Counter("slipstream_auth_failures_total", "Requests refused for a missing or wrong key, before any work",
                        ("door", "reason"), registry=REGISTRY)
EDGE_REFUSALS = Counter("slipstream_edge_refusals_total", "Connections closed by the HTTP layer before the app saw a request",
                        ("reason",), registry=REGISTRY)

log = logging.getLogger("slipstream.refusals")


def client_address(scope: Mapping[str, Any]) -> str:
    """The peer's address (no port: one client opens many connections). Behind a reverse proxy this is
    the proxy's address; `X-Forwarded-For` is not trusted, since any client can write it."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


@dataclass
class RateLimitedLog:
    """One warning per source per `interval_s`; the lines in between are counted and the count goes
    out with the source's next line. Remembers at most `max_sources` sources (the oldest are forgotten),
    so many addresses cannot grow it without bound."""

    logger: logging.Logger
    interval_s: float = 10.0
    max_sources: int = 10_000
    clock: Callable[[], float] = time.monotonic
    _seen: dict[str, tuple[float, int]] = field(default_factory=dict)  # source -> (last line at, left out since)

    def warning(self, source: str, message: str, *args: object) -> bool:
        """Log `message % args` for `source` unless it had a line within the interval; True when logged."""
        now = self.clock()
        last = self._seen.get(source)
        if last is not None and now - last[0] < self.interval_s:
            self._seen[source] = (last[0], last[1] + 1)
            return False
        self._seen.pop(source, None)  # re-inserted last: the dict stays ordered oldest first
        self._seen[source] = (now, 0)
        while len(self._seen) > self.max_sources:
            del self._seen[next(iter(self._seen))]
        left_out = last[1] if last is not None else 0
        suffix = f" ({left_out} more from {source} not logged in the last {self.interval_s:g} s)" if left_out else ""
        self.logger.warning(message + suffix, *args)
        return True


AUTH_LOG = RateLimitedLog(log)


def auth_failure(door: str, reason: str, source: str, path: str) -> None:
    """Count and (rate-limited) log one refused key: `door` is "team" or "admin"."""
    AUTH_FAILURES.labels(door, reason).inc()
    AUTH_LOG.warning(f"{door}:{source}", "%s key refused (%s) from %s on %s", door, reason, source, path)
