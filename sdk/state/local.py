"""In-process state: the default backend, and the fallback a replica uses while Redis is away.

Everything runs synchronously on the event loop between awaits, so admit's check-then-charge needs
no lock. Same semantics as the Redis scripts (sdk/state/redis_scripts.py), one process's worth.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sdk.offload import FairPool
from sdk.state.backend import Admission, BudgetCheck, Rate, Refusal, Settlement
from sdk.state.spend_file import Records, SpendFile

# A batch's hold and its end are spend-file transactions, which may wait for the file's lock (another
# worker's) and its disk: they take turns by team in a thread of their own (one: the file's holds lock
# admits one at a time). In asyncio's default pool, first come, first served and shared with every
# `to_thread` caller (policy reloads, /metrics), a team's many batch creates held another team's.
_SPEND_FILE = FairPool(workers=1, name="slipstream-spend-file")
_DUST = 1e-9  # a token bucket admits while any balance is left: usage is charged afterwards


@dataclass(slots=True)
class _Bucket:
    level: float
    updated: float

    def refill(self, rate: Rate, now: float) -> float:
        self.level = min(rate.per_minute, self.level + (now - self.updated) * rate.per_minute / 60)
        self.updated = now
        return self.level


@dataclass(slots=True)
class _Record:
    expires: float
    fields: dict[str, float] = field(default_factory=dict)


class LocalState:
    kind = "local"

    def __init__(self, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 spend_file: SpendFile | None = None) -> None:
        self._clock = clock
        self._wall = wall
        self._buckets: dict[str, _Bucket] = {}
        self._leases: dict[str, dict[str, int]] = {}  # cap → lease → the slots it takes
        self._records: dict[str, _Record] = {}  # spend, without a spend file
        # With one, spend is the file's records as its writer last read them back (every worker's, across
        # restarts: sdk/state/spend_file.py), and on top this process's charges those do not include yet:
        # each (charge number, key, fields, USD), and their sums per record (a read costs one record's fields).
        self._spend_file = spend_file
        self._unsynced: deque[tuple[int, str, tuple[str, ...], float]] = deque()
        self._pending: dict[str, _Record] = {}
        self._flags: dict[str, float] = {}
        self._claims: dict[str, float] = {}
        self._holds: dict[str, dict[str, float]] = {}  # budget record → lease → USD held while it runs
        self._batch_holds: set[str] = set()  # leases among them held host-wide too, in the spend file

    def _bucket(self, rate: Rate, now: float) -> _Bucket:
        bucket = self._buckets.get(rate.key)
        if bucket is None:
            bucket = self._buckets[rate.key] = _Bucket(rate.per_minute, now)
        bucket.refill(rate, now)
        return bucket

    async def admit(self, admission: Admission) -> Refusal | None:
        if admission.batch and admission.budget is not None and self._spend_file is not None:
            return await self._hold_batch(admission.lease, admission.budget, self._spend_file)
        now = self._clock()
        for i, cap in enumerate(admission.caps):
            held = sum(self._leases.get(cap.key, {}).values())
            if held + cap.weight > cap.limit:
                return Refusal("cap", i, 1.0, held)
        buckets = [self._bucket(rate, now) for rate in admission.rates]
        for i, (rate, bucket) in enumerate(zip(admission.rates, buckets, strict=True)):
            need = rate.cost or _DUST
            if bucket.level < need:
                return Refusal("rate", i, (need - bucket.level) * 60 / rate.per_minute, bucket.level)
        budget = admission.budget
        if budget is not None:
            fields = await self.spend(budget.key)
            spent = fields.get("total", 0.0) + fields.get("held", 0.0)
            if spent >= budget.usd:
                return Refusal("budget", 0, 0.0, spent)
            if budget.reserve > 0:
                self._holds.setdefault(budget.key, {})[admission.lease] = budget.reserve
        for rate, bucket in zip(admission.rates, buckets, strict=True):
            bucket.level -= rate.cost
        for cap in admission.caps:
            self._leases.setdefault(cap.key, {})[admission.lease] = cap.weight
        return None

    async def _hold_batch(self, lease: str, budget: BudgetCheck, spend_file: SpendFile) -> Refusal | None:
        """A batch's worst cost, checked and held host-wide: the workers of `--workers N --local-state`
        share the spend file, not their memory, and a batch's hold can be the whole remainder of a
        budget, so holding it in one worker's memory let every worker admit one against the same
        remainder. Also held here, where this worker's requests count it."""
        wall = self._wall()
        found = self._synced(spend_file).get(budget.key)
        seen = found[1].get("total", 0.0) if found is not None and found[0] > wall else 0.0
        pending = self._pending.get(budget.key)
        extra = pending.fields.get("total", 0.0) if pending is not None else 0.0
        extra += sum(usd for held, usd in self._holds.get(budget.key, {}).items() if held not in self._batch_holds)
        hold = functools.partial(spend_file.hold_batch, budget.key, lease, budget.reserve, budget.usd, seen, extra, wall)
        value = await asyncio.wrap_future(_SPEND_FILE.submit(hold))
        if value is not None:
            return Refusal("budget", 0, 0.0, value)
        self._holds.setdefault(budget.key, {})[lease] = budget.reserve
        self._batch_holds.add(lease)
        return None

    def settle(self, settlement: Settlement) -> None:
        if settlement.lease in self._batch_holds and self._spend_file is not None:
            self._end_batch_hold(settlement, self._spend_file)
            return
        for key in settlement.caps:
            self._leases.get(key, {}).pop(settlement.lease, None)
        self._release(settlement)
        now = self._clock()
        for rate, amount in settlement.charges:
            self._bucket(rate, now).level -= amount
        spend = settlement.spend
        if spend is not None and spend.usd:
            wall = self._wall()
            filed = self._synced(self._spend_file) if self._spend_file is not None else {}
            for key, keep_s in spend.records:
                if self._spend_file is not None:
                    expires = self._filed_expiry(filed, key, wall) or wall + keep_s
                    number = self._spend_file.add(key, expires, spend.fields, spend.usd)
                    self._unsynced.append((number, key, spend.fields, spend.usd))
                    pending = self._pending.setdefault(key, _Record(expires))
                    for name in spend.fields:
                        pending.fields[name] = pending.fields.get(name, 0.0) + spend.usd
                    continue
                record = self._live_record(key, wall)
                if record is None:
                    record = self._records[key] = _Record(wall + keep_s)
                for name in spend.fields:
                    record.fields[name] = record.fields.get(name, 0.0) + spend.usd

    def _release(self, settlement: Settlement) -> None:
        """Let go of what the settled request held against its budget."""
        if settlement.budget is not None:
            held = self._holds.get(settlement.budget.key)
            if held is not None:
                held.pop(settlement.lease, None)
                if not held:
                    del self._holds[settlement.budget.key]

    def _end_batch_hold(self, settlement: Settlement, spend_file: SpendFile) -> None:
        """End a host-wide batch hold, its creation charge (if any) written in its place in one
        transaction, then carried here until the file's writer reads it back (a no-op charge numbers
        that moment), as this worker's other charges are. The transaction waits for the file's lock
        (another worker's batch admission), so on an event loop it runs in a thread; the hold counts
        here until it has ended."""
        self._batch_holds.discard(settlement.lease)
        spend, wall = settlement.spend, self._wall()
        charges: list[tuple[str, float, tuple[str, ...], float]] = []
        if spend is not None and spend.usd:
            filed = self._synced(spend_file)
            charges = [(key, self._filed_expiry(filed, key, wall) or wall + keep_s, spend.fields, spend.usd)
                       for key, keep_s in spend.records]
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop to keep free
            self._batch_hold_ended(settlement, spend_file, charges, spend_file.end_batch_hold(settlement.lease, charges))
            return
        ending = asyncio.wrap_future(_SPEND_FILE.submit(functools.partial(spend_file.end_batch_hold, settlement.lease, charges)),
                                     loop=loop)
        ending.add_done_callback(lambda done: self._batch_hold_ended(
            settlement, spend_file, charges, not done.cancelled() and done.exception() is None and done.result()))

    def _batch_hold_ended(self, settlement: Settlement, spend_file: SpendFile,
                          charges: list[tuple[str, float, tuple[str, ...], float]], written: bool) -> None:
        self._release(settlement)
        if not written:
            if settlement.spend is not None:
                self.settle(Settlement("", spend=settlement.spend))  # through the writer, as any charge
            return
        for key, expires, fields, usd in charges:
            self._unsynced.append((spend_file.add(key, expires, (), 0.0), key, fields, usd))
            pending = self._pending.setdefault(key, _Record(expires))
            for name in fields:
                pending.fields[name] = pending.fields.get(name, 0.0) + usd

    def _live_record(self, key: str, wall: float) -> _Record | None:
        if self._spend_file is not None:
            return self._filed_record(self._spend_file, key, wall)
        record = self._records.get(key)
        if record is not None and record.expires <= wall:
            del self._records[key]
            return None
        return record

    def _synced(self, spend_file: SpendFile) -> Records:
        """The records as the spend file's writer last read them; this process's charges they include
        are no longer carried on top."""
        included, records = spend_file.view
        while self._unsynced and self._unsynced[0][0] <= included:
            _, charged, fields, usd = self._unsynced.popleft()
            for name in fields:
                self._pending[charged].fields[name] -= usd
        if not self._unsynced:
            self._pending.clear()  # all included: no sums left to carry (nor their rounding)
        return records

    def _filed_expiry(self, filed: Records, key: str, wall: float) -> float | None:
        """When the live record `key` ends, as `filed` (`_synced`) or as this process started it; None:
        no live record. (What a charge needs, without copying the record's fields as `_filed_record` does.)"""
        found, pending = filed.get(key), self._pending.get(key)
        for expires in (found[0] if found is not None else None, pending.expires if pending is not None else None):
            if expires is not None and expires > wall:
                return expires
        return None

    def _filed_record(self, spend_file: SpendFile, key: str, wall: float) -> _Record | None:
        """The record as the spend file's writer last read it, with this process's charges since on top."""
        found, pending = self._synced(spend_file).get(key), self._pending.get(key)
        record = _Record(found[0], dict(found[1])) if found is not None else None
        if pending is not None:
            record = record if record is not None else _Record(pending.expires)
            for name, usd in pending.fields.items():
                record.fields[name] = record.fields.get(name, 0.0) + usd
        return record if record is not None and record.expires > wall else None

    async def spend(self, key: str) -> dict[str, float]:
        """The record's fields, and `held`: what requests in flight hold against it (as in Redis)."""
        record = self._live_record(key, self._wall())
        fields = dict(record.fields) if record is not None else {}
        held = self._holds.get(key)
        if held:
            fields["held"] = sum(held.values())
        return fields

    def spend_records(self) -> list[tuple[str, float, dict[str, float]]]:
        """Every live spend record kept in memory (a replica's while Redis was away: it has no spend
        file): (key, seconds left, fields) — what a healed shared store absorbs."""
        wall = self._wall()
        return [(key, record.expires - wall, dict(record.fields)) for key, record in self._records.items() if record.expires > wall]

    def forget_spend(self) -> None:
        self._records.clear()

    async def set_flag(self, name: str, until: float) -> None:
        self._flags[name] = max(until, self._flags.get(name, 0.0))

    async def clear_flag(self, name: str) -> None:
        self._flags.pop(name, None)

    def flags(self) -> Mapping[str, float]:
        return self._flags

    async def claim(self, name: str, ttl_s: float) -> bool:
        now = self._clock()
        if self._claims.get(name, 0.0) > now:
            return False
        self._claims[name] = now + ttl_s
        return True

    async def close(self) -> None:
        if self._spend_file is not None:
            self._spend_file.close()
