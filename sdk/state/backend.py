"""The state backend's interface: what replicas must agree on, in a few coarse calls.

One request costs one call before it runs (`admit`: every rate bucket, concurrency cap and budget it
touches, checked and charged atomically) and one after (`settle`: leases released, tokens and spend
charged, sent in the background), so a shared store adds at most one round trip to a request's
latency (none far from every limit: sdk/state/headroom.py). Breakers and key cooldowns share *flags*: a
name with an expiry (wall-clock seconds), read from a local mirror that the backend keeps fresh, so
the routing hot path asks nothing of the store.

Implementations: `LocalState` (in process, the default) and `RedisState`; `GuardedState` puts a
breaker around a shared one and falls back to local state while it is unreachable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol


def team_slot(team: str) -> str:
    """A team's part of a key name, as a Redis Cluster hash tag: a script may touch the keys of one
    hash slot only, and each script call touches one team's keys (buckets, slots, spend, holds)."""
    return "{" + team + "}"


@dataclass(frozen=True, slots=True)
class Rate:
    """A token bucket of `per_minute` capacity, refilled continuously."""

    key: str
    per_minute: float
    cost: float  # taken at admission: 1 for a request bucket, 0 for a token bucket (any positive balance admits)


@dataclass(frozen=True, slots=True)
class Cap:
    """At most `limit` slots held at once; a lease expires unless its holder renews it (a dead replica's slots come back)."""

    key: str
    limit: int
    weight: int = 1  # the slots one lease takes: the upstream requests it makes (Chat's n on Claude, docs/routing.md)


@dataclass(frozen=True, slots=True)
class BudgetCheck:
    """Refuse once the period's spend plus what requests in flight hold reaches `usd`; an admitted
    request holds `reserve` (its estimated worst cost) until it settles, so in-flight requests
    cannot together overshoot the budget by more than one reservation (docs/spend.md)."""

    key: str  # the spend record of the current period (sdk/spend.py)
    usd: float
    reserve: float = 0.0  # USD held for this request while it runs

    @property
    def holds(self) -> str:
        """The key of the period's holds (a shared backend's set of the leases holding USD)."""
        return f"{self.key}:holds"


@dataclass(frozen=True, slots=True)
class Admission:
    lease: str  # unique per request; names its concurrency slots
    rates: tuple[Rate, ...] = ()
    caps: tuple[Cap, ...] = ()
    budget: BudgetCheck | None = None
    # A batch's worst cost (budget only): where replicas share no store but files (`--workers N --local-state`),
    # checked and held host-wide, and replaced by the batch's creation charge host-wide (sdk/state/spend_file.py)
    batch: bool = False

    @property
    def holds(self) -> bool:
        """Whether admitting it holds something (a slot, a budget reservation) until it settles."""
        return bool(self.caps) or (self.budget is not None and self.budget.reserve > 0)


@dataclass(frozen=True, slots=True)
class Refusal:
    kind: Literal["rate", "cap", "budget"]
    index: int  # into the admission's rates or caps
    wait_s: float  # until a rate bucket has room again
    value: float  # leases held (cap) or USD spent and held by requests in flight (budget)
    # The request never fits what may be admitted now (a replica's share of a limit while the shared
    # store is down): `value` is that share, and no wait helps
    too_large: bool = False


@dataclass(frozen=True, slots=True)
class SpendRecord:
    """USD spent by one request, added to each period's record under every field given."""

    usd: float
    records: tuple[tuple[str, float], ...]  # (record key, seconds to keep it)
    fields: tuple[str, ...]  # "total", "key:ID", "model:NAME", "estimated" (usage counted by the gateway)


@dataclass(frozen=True, slots=True)
class Settlement:
    lease: str
    caps: tuple[str, ...] = ()  # cap keys whose lease ends now
    charges: tuple[tuple[Rate, float], ...] = ()  # token buckets and the amount used
    spend: SpendRecord | None = None
    budget: BudgetCheck | None = None  # the budget whose reservation for this lease ends now


class StateBackend(Protocol):
    kind: str  # "local" | "redis"

    async def admit(self, admission: Admission) -> Refusal | None:
        """Check every rate, cap and budget; charge all of them only if none refuses."""
        ...

    def settle(self, settlement: Settlement) -> None:
        """Release the request's leases and charge its tokens and spend. Never blocks the request:
        a shared backend sends it in the background."""
        ...

    async def spend(self, key: str) -> dict[str, float]:
        """A spend record's fields (total, key:ID, model:NAME) in USD."""
        ...

    async def set_flag(self, name: str, until: float) -> None:
        """Raise flag `name` until wall-clock time `until` (a breaker opened, a key cooling down)."""
        ...

    async def clear_flag(self, name: str) -> None: ...

    def flags(self) -> Mapping[str, float]:
        """The flags as last seen (no I/O): name → until."""
        ...

    async def claim(self, name: str, ttl_s: float) -> bool:
        """True for exactly one caller until `ttl_s` passes (a half-open breaker's single probe)."""
        ...

    async def close(self) -> None: ...
