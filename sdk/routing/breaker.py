"""Per-target circuit breaker: closed → open → half-open → closed.

Closed: outcomes go into a sliding time window; once it holds `min_requests` outcomes and the
failure share reaches `failure_rate`, the target opens. A 401/403 opens it at once (our upstream key
is wrong there; retrying cannot help). Open: the target is skipped for `cooldown_s`. Half-open: one
request at a time probes it; success closes the breaker, failure opens it for another cooldown.

State lives behind `BreakerStore`, an async Protocol: `InMemoryBreakerStore` for one process, and
`SharedBreakerStore` (sdk/routing/shared_breaker.py) when replicas share a state backend.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from sdk.policy import BreakerPolicy


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class BreakerStore(Protocol):
    async def acquire(self, key: str) -> bool:
        """May `key` be tried now? In half-open state this claims the single probe."""
        ...

    async def record(self, key: str, failed: bool, open_now: bool = False) -> None:
        """The outcome of an attempt that `acquire` allowed (or that ran with every target open)."""
        ...

    async def release(self, key: str) -> None:
        """An allowed attempt ended without a verdict (cancelled): free the half-open probe."""
        ...

    async def state(self, key: str) -> BreakerState: ...


@dataclass(slots=True)
class _Circuit:
    state: BreakerState = BreakerState.CLOSED
    outcomes: deque[tuple[float, bool]] = field(default_factory=deque)  # (time, failed)
    failures: int = 0  # failures inside `outcomes`
    opened_at: float = 0.0
    probing: bool = False  # a half-open probe is in flight


class InMemoryBreakerStore:
    """One process's breakers; every method is synchronous inside, so no lock is needed on one loop."""

    def __init__(self, policy: BreakerPolicy, clock: Callable[[], float] = time.monotonic):
        self.policy = policy
        self._clock = clock
        self._circuits: dict[str, _Circuit] = {}

    def _circuit(self, key: str) -> _Circuit:
        circuit = self._circuits.get(key)
        if circuit is None:
            circuit = self._circuits[key] = _Circuit()
        if circuit.state is BreakerState.OPEN and self._clock() - circuit.opened_at >= self.policy.cooldown_s:
            circuit.state, circuit.probing = BreakerState.HALF_OPEN, False
        return circuit

    async def acquire(self, key: str) -> bool:
        if not self.policy.enabled:
            return True
        circuit = self._circuit(key)
        if circuit.state is BreakerState.CLOSED:
            return True
        if circuit.state is BreakerState.HALF_OPEN and not circuit.probing:
            circuit.probing = True
            return True
        return False

    async def record(self, key: str, failed: bool, open_now: bool = False) -> None:
        if not self.policy.enabled:
            return
        circuit = self._circuit(key)
        now = self._clock()
        if circuit.state is not BreakerState.CLOSED:
            # A probe's verdict (or an attempt made because every target was open).
            if failed:
                self._open(circuit, now)
            else:
                self._circuits[key] = _Circuit()
            return
        if open_now:
            self._open(circuit, now)
            return
        circuit.outcomes.append((now, failed))
        circuit.failures += failed
        horizon = now - self.policy.window_s
        while circuit.outcomes and circuit.outcomes[0][0] < horizon:
            circuit.failures -= circuit.outcomes.popleft()[1]
        total = len(circuit.outcomes)
        if failed and total >= self.policy.min_requests and circuit.failures >= self.policy.failure_rate * total:
            self._open(circuit, now)

    async def release(self, key: str) -> None:
        circuit = self._circuits.get(key)
        if circuit is not None:
            circuit.probing = False

    async def state(self, key: str) -> BreakerState:
        return self._circuit(key).state

    @staticmethod
    def _open(circuit: _Circuit, now: float) -> None:
        circuit.state, circuit.opened_at, circuit.probing = BreakerState.OPEN, now, False
        circuit.outcomes.clear()
        circuit.failures = 0
