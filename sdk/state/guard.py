"""A breaker around the shared store: when Redis cannot answer, the replica keeps serving on local state.

Every call to Redis is bounded: by the URL's timeout when a request waits for it, by 1 s when none
does (charges and settlements batched in the background, the check-in). The first failure opens the
guard and from then on requests go to local state without touching Redis, so a Redis that hangs
costs a request at most one timeout, once. Far from every limit a request waits for nothing at all
(sdk/state/headroom.py). Degraded, a replica enforces each limit divided by the last known number of live
replicas, and a budget by its share of what was left. A background task checks in with Redis every
`sync_interval_s` (it is also the probe); its first success heals the guard and hands the spend
recorded meanwhile to Redis. Each transition is one log line, `slipstream_state_backend_up` on
/metrics, and `status()` for /readyz.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import replace
from typing import Any, Final, TypeVar

from sdk.observability.metrics import STATE_ADMISSIONS, STATE_BACKEND_UP
from sdk.state import masked_url
from sdk.state.backend import Admission, Rate, Refusal, Settlement
from sdk.state.local import LocalState
from sdk.state.redis import Entries, RedisState
from sdk.state.resp import RespError

log = logging.getLogger("slipstream.state")
BACKGROUND_TIMEOUT_S = 1.0
FLUSH_EVERY_S = 0.002  # charges and settlements wait this long for company: one write, one script per group
AHEAD, CHECKED, LOCAL = (STATE_ADMISSIONS.labels(how) for how in ("ahead", "checked", "local"))
T = TypeVar("T")


class GuardedState:
    kind = "redis"

    def __init__(self, shared: RedisState, sync_interval_s: float = 0.5):
        self.shared = shared
        self.local = LocalState()
        self.sync_interval_s = sync_interval_s
        self.up = True  # until a call says otherwise; the first sync runs at once
        self.down_since: float | None = None
        self.last_error = ""
        self._where: dict[str, RedisState | LocalState] = {}  # lease → the backend that admitted it
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._pending: set[asyncio.Task[None]] = set()  # charges on their way to Redis
        self._outbox: list[Admission | Settlement | Entries] = []  # charges of this loop iteration, sent in one pipeline
        STATE_BACKEND_UP.set(1)

    # --- the StateBackend calls ----------------------------------------------------------------

    async def admit(self, admission: Admission) -> Refusal | None:
        room = self.shared.room
        if self.up and room.grants(admission, self.shared.replicas):  # far from every limit: do not wait
            AHEAD.inc()
            if admission.holds:
                self._where[admission.lease] = self.shared
            room.unanswered += 1
            self._post(admission)
            return None
        if any(isinstance(item, Admission) for item in self._outbox):
            # Charges of admissions granted ahead are waiting: Redis must count them before it checks
            # this one. Send them now; they reach the connection first (this task yields once).
            self._send(self._send_outbox(delay_s=0))
            await asyncio.sleep(0)
        shared = await self._shared(lambda: self.shared.admit(admission))
        (CHECKED if shared is not DOWN else LOCAL).inc()
        if shared is not DOWN:
            if shared is None and admission.holds:
                self._where[admission.lease] = self.shared
            return shared
        share = self._local_share(admission)
        too_large = _beyond(share)
        if too_large is not None:
            return too_large
        refusal = await self.local.admit(share)
        if refusal is None and admission.holds:
            self._where[admission.lease] = self.local
        return refusal

    def merge_entries(self, rows: list[tuple[str, str, float, float]]) -> None:
        """Merge expiring entries into Redis with the next batch (the shared prompt-cache ledger);
        dropped while Redis is away (the local ledger has them)."""
        if self.up:
            self._post(Entries(tuple(rows)))

    def _post(self, item: Admission | Settlement | Entries) -> None:
        """Queue a charge for Redis: what the next FLUSH_EVERY_S queues goes out in one pipelined write."""
        self._outbox.append(item)
        if len(self._outbox) == 1:  # the first of this batch: one task sends them all
            self._send(self._send_outbox(FLUSH_EVERY_S))

    def _send(self, call: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(call)
        self._pending.add(task)  # held until sent: close() waits for what is on its way
        task.add_done_callback(self._pending.discard)

    async def _send_outbox(self, delay_s: float) -> None:
        closing = False
        if delay_s:
            try:
                await asyncio.sleep(delay_s)  # let the charges of the next moments join the batch
            except asyncio.CancelledError:  # the loop is shutting down (asyncio.run's end): send what waits all the same
                closing = True
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
        batch, self._outbox = self._outbox, []
        if batch:  # else sent already, ahead of a checked admission
            ahead = sum(isinstance(item, Admission) for item in batch)
            try:
                sent = await self._shared(lambda: self.shared.send_batch(batch), background=True)
            finally:
                self.shared.room.unanswered -= ahead
            if sent is DOWN:
                for item in batch:
                    if isinstance(item, Settlement):
                        self.local.settle(item)  # tokens and spend still count, against this replica's share
        if closing:
            raise asyncio.CancelledError

    def settle(self, settlement: Settlement) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # a stream closed from outside the event loop: hand it over to the loop
            if self._task is not None and not self._task.get_loop().is_closed():
                self._task.get_loop().call_soon_threadsafe(self.settle, settlement)
            else:
                self._where.pop(settlement.lease, None)
                self.local.settle(settlement)
            return
        where = self._where.pop(settlement.lease, None)
        self.shared.room.settled(settlement)
        if where is self.local or not self.up:
            if where is self.shared:  # Redis lets its slots and holds expire: stop renewing them
                self.shared.forget(settlement.lease)
            self.local.settle(settlement)
            return
        self._post(settlement)

    async def spend(self, key: str) -> dict[str, float]:
        shared = await self._shared(lambda: self.shared.spend(key))
        local = await self.local.spend(key)
        if shared is DOWN:
            return local
        return {name: shared.get(name, 0.0) + local.get(name, 0.0) for name in shared.keys() | local.keys()}

    async def set_flag(self, name: str, until: float) -> None:
        await self.local.set_flag(name, until)  # holds here even while Redis is away
        await self._shared(lambda: self.shared.set_flag(name, until))

    async def clear_flag(self, name: str) -> None:
        await self.local.clear_flag(name)
        await self._shared(lambda: self.shared.clear_flag(name))

    def flags(self) -> Mapping[str, float]:
        if self._task is None and not self._closed:
            self.start()  # the mirror is kept by the check-in loop: a replica that reads flags needs it running
        shared, local = self.shared.flags(), self.local.flags()
        return {**shared, **local} if local else shared

    async def claim(self, name: str, ttl_s: float) -> bool:
        claimed = await self._shared(lambda: self.shared.claim(name, ttl_s))
        return await self.local.claim(name, ttl_s) if claimed is DOWN else claimed

    async def close(self) -> None:
        if self._pending:
            await asyncio.wait(self._pending, timeout=self.shared.timeout_s * 2)
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self.up:
            await self._shared(self.shared.leave)
        await self.shared.close()

    # --- health --------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {
            "backend": "redis",
            "up": self.up,
            "mode": "shared" if self.up else "degraded",
            "replicas": self.shared.replicas,
            "down_for_s": round(time.monotonic() - self.down_since, 1) if self.down_since is not None else None,
            "last_error": self.last_error or None,
        }

    def start(self) -> None:
        """Run the check-in loop on the running event loop (again if the loop changed)."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.get_loop() is not loop or self._task.done():
            self._task = loop.create_task(self._check_in_forever(), name="slipstream-state-sync")

    async def _check_in_forever(self) -> None:
        while not self._closed:
            if await self._shared(self.shared.sync, probe=True, background=True) is not DOWN and not self.up:
                await self._heal()
            await asyncio.sleep(self.sync_interval_s)

    async def try_shared(self, call: Callable[[], Awaitable[T]]) -> T | Down:
        """`call()` (a call to `self.shared`) within the timeout, or DOWN: the caller falls back."""
        return await self._shared(call)

    async def _shared(self, call: Callable[[], Awaitable[T]], probe: bool = False, background: bool = False) -> T | Down:
        """`call()` within the timeout, or DOWN (the guard opens on a failure; an open guard skips the call)."""
        if not self._closed:
            self.start()
        if not (self.up or probe):
            return DOWN
        try:
            # No request waits for a background call (charges, settlements, the check-in): it gets a
            # longer bound, so a replica whose own event loop lags under load does not degrade for it.
            async with asyncio.timeout(max(BACKGROUND_TIMEOUT_S, self.shared.timeout_s) if background else self.shared.timeout_s):
                return await call()
        except (RespError, OSError, TimeoutError) as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError from exc  # a cancelled request, not a failed Redis
            self._went_down(exc)
            return DOWN

    def _went_down(self, exc: BaseException) -> None:
        # /readyz and the log show it: an error that quotes the URL must not carry its password
        self.last_error = (f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__).replace(
            self.shared.url, masked_url(self.shared.url))
        if not self.up:
            return
        self.up, self.down_since = False, time.monotonic()
        STATE_BACKEND_UP.set(0)
        log.warning("state backend %s unreachable (%s): degraded to local state, limits divided by %d replicas",
                    masked_url(self.shared.url), self.last_error, self.shared.replicas)

    async def _heal(self) -> None:
        records = self.local.spend_records()
        if records:
            if await self._shared(lambda: self.shared.add_spend(records), probe=True) is DOWN:
                return  # gone again; the next check-in tries once more
            self.local.forget_spend()
        down_for = time.monotonic() - (self.down_since or time.monotonic())
        self.up, self.down_since, self.last_error = True, None, ""
        STATE_BACKEND_UP.set(1)
        log.warning("state backend %s is back after %.1f s: shared state restored (%d replicas)", masked_url(self.shared.url), down_for,
                    self.shared.replicas)

    def _local_share(self, admission: Admission) -> Admission:
        """This replica's share of each limit while it cannot see the others."""
        n = self.shared.replicas
        budget = admission.budget
        if budget is not None:
            left = budget.usd - self.shared.last_spent.get(budget.key, 0.0)
            budget = replace(budget, usd=max(0.0, left) / n)
        return replace(
            admission,
            # at least one request a minute, as a cap keeps at least one slot: below it a request bucket never
            # filled to one request's cost, and a team whose limit was under the replicas' count got none through
            rates=tuple(Rate(r.key, max(r.per_minute / n, 1.0), r.cost) for r in admission.rates),
            caps=tuple(replace(c, limit=max(1, math.ceil(c.limit / n))) for c in admission.caps),
            budget=budget,
        )


def _beyond(share: Admission) -> Refusal | None:
    """A lease weighted above this replica's share of a cap, or costing more requests than its share of a
    request bucket holds (Chat's n choices on Claude: n slots, n requests), never fits while Redis is away:
    refused as too large at once, as the limits stage refuses one above the limit itself, where the local
    state answered "retry in 1 s" (or in a minute) for as long as Redis stayed away."""
    too_large = [Refusal("cap", i, 0.0, cap.limit, too_large=True) for i, cap in enumerate(share.caps) if cap.weight > cap.limit]
    too_large += [Refusal("rate", i, 0.0, rate.per_minute, too_large=True) for i, rate in enumerate(share.rates)
                  if rate.cost > rate.per_minute]
    return too_large[0] if too_large else None


class Down(enum.Enum):
    """What a shared call returns when Redis could not answer (an enum member, so `is DOWN` narrows types)."""

    DOWN = "down"


DOWN: Final = Down.DOWN
