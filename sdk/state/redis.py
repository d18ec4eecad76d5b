"""Redis (≥ 6.2, or Valkey) as the shared state backend: `redis://[:PASSWORD@]HOST:PORT/DB`, `rediss://` for TLS.

Two query parameters of the URL are Slipstream's own: `prefix` (default `slipstream`) namespaces the
keys, so several deployments can share one Redis; `timeout_ms` (default 100) bounds every call. The
client never retries by itself: a failure goes straight to `GuardedState`, which decides.

The `redis` package is imported here only, when a state URL names Redis ([redis] extra).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from sdk.extras import missing_extra_message
from sdk.state import redis_scripts
from sdk.state.backend import Admission, Refusal, Settlement

LEASE_TTL_S = 30.0  # a dead replica's concurrency slots come back after this
REPLICA_TTL_S = 5.0  # a replica that has not checked in for this long no longer counts


def split_url(url: str) -> tuple[str, str, float]:
    """(the URL redis-py sees, key prefix, timeout in seconds)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    prefix = query.pop("prefix", "slipstream")
    timeout_s = float(query.pop("timeout_ms", "100")) / 1000
    return urlunsplit(parts._replace(query=urlencode(query))), prefix, timeout_s


class RedisState:
    kind = "redis"

    def __init__(self, url: str, replica_id: str | None = None):
        missing = missing_extra_message("redis", "a redis:// state URL")
        if missing:
            raise RuntimeError(missing)
        self.url, self.prefix, self.timeout_s = split_url(url)
        self.replica_id = replica_id or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scripts: dict[str, Any] = {}
        self._flags: dict[str, float] = {}
        self._held: dict[str, tuple[str, ...]] = {}  # lease → cap keys, renewed while the request runs
        self.replicas = 1
        self.last_spent: dict[str, float] = {}  # budget record → USD spent, as of the last admission

    def key(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    def client(self) -> Any:
        """The client of the running event loop (redis-py connections belong to one loop)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            import redis.asyncio as aioredis
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff

            self._client = aioredis.Redis.from_url(
                self.url, socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s,
                retry=Retry(NoBackoff(), 0), decode_responses=True, health_check_interval=0,
            )
            self._loop = loop
            self._scripts = {name: self._client.register_script(getattr(redis_scripts, name)) for name in ("ADMIT", "SETTLE", "RENEW")}
        return self._client

    async def admit(self, admission: Admission) -> Refusal | None:
        client = self.client()
        keys = [self.key(r.key) for r in admission.rates] + [self.key(c.key) for c in admission.caps]
        args: list[Any] = [len(admission.rates), len(admission.caps), int(admission.budget is not None), admission.lease, LEASE_TTL_S]
        for rate in admission.rates:
            args += [rate.per_minute, rate.cost]
        args += [cap.limit for cap in admission.caps]
        if admission.budget is not None:
            keys.append(self.key(admission.budget.key))
            args.append(admission.budget.usd)
        kind, index, wait_s, value = await self._scripts["ADMIT"](keys=keys, args=args, client=client)
        if kind != "ok":
            return Refusal(kind, int(index), float(wait_s), float(value))
        if admission.budget is not None:  # what a degraded replica budgets against (sdk/state/guard.py)
            self.last_spent[admission.budget.key] = float(value)
        if admission.caps:
            self._held[admission.lease] = tuple(keys[len(admission.rates):len(admission.rates) + len(admission.caps)])
        return None

    async def settle(self, settlement: Settlement) -> None:
        self._held.pop(settlement.lease, None)
        keys = [self.key(k) for k in settlement.caps] + [self.key(rate.key) for rate, _ in settlement.charges]
        spend = settlement.spend
        records = spend.records if spend is not None and spend.usd else ()
        args: list[Any] = [len(settlement.caps), len(settlement.charges), len(records), settlement.lease]
        for rate, amount in settlement.charges:
            args += [rate.per_minute, amount]
        if records:
            keys += [self.key(key) for key, _ in records]
            args += [repr(spend.usd), len(spend.fields), *spend.fields, *(int(keep) for _, keep in records)]
        await self._scripts["SETTLE"](keys=keys, args=args, client=self.client())

    async def spend(self, key: str) -> dict[str, float]:
        fields = await self.client().hgetall(self.key(key))
        return {name: float(value) for name, value in fields.items()}

    async def add_spend(self, records: list[tuple[str, float, dict[str, float]]]) -> None:
        """Add spend recorded elsewhere (locally, while Redis was away): (key, seconds to keep, fields)."""
        async with self.client().pipeline(transaction=False) as pipe:
            for key, keep_s, fields in records:
                for name, usd in fields.items():
                    pipe.hincrbyfloat(self.key(key), name, usd)
                pipe.expire(self.key(key), max(1, int(keep_s)))
            await pipe.execute()

    async def set_flag(self, name: str, until: float) -> None:
        self._flags[name] = until  # seen here at once; by the other replicas at their next sync
        await self.client().hset(self.key("flags"), name, repr(until))

    async def clear_flag(self, name: str) -> None:
        self._flags.pop(name, None)
        await self.client().hdel(self.key("flags"), name)

    def flags(self) -> Mapping[str, float]:
        return self._flags

    async def claim(self, name: str, ttl_s: float) -> bool:
        return bool(await self.client().set(self.key(f"claim:{name}"), self.replica_id, nx=True, px=max(1, int(ttl_s * 1000))))

    async def sync(self) -> int:
        """One round trip: check in as a live replica, count the live ones, renew this replica's
        leases, and refresh the flag mirror. Returns the replica count."""
        client = self.client()
        now = time.time()
        replicas = self.key("replicas")
        async with client.pipeline(transaction=False) as pipe:
            pipe.zadd(replicas, {self.replica_id: now})
            pipe.zremrangebyscore(replicas, "-inf", now - REPLICA_TTL_S)
            pipe.zcard(replicas)
            pipe.hgetall(self.key("flags"))
            held = list(self._held.items())
            if held:
                await self._scripts["RENEW"](keys=[k for _, caps in held for k in caps],
                                       args=[LEASE_TTL_S, *(lease for lease, caps in held for _ in caps)], client=pipe)
            results = await pipe.execute()
        self.replicas = max(1, int(results[2]))
        self._flags = {name: float(until) for name, until in results[3].items() if float(until) > now}
        return self.replicas

    async def leave(self) -> None:
        """Stop counting as a live replica (a clean shutdown)."""
        await self.client().zrem(self.key("replicas"), self.replica_id)

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()
