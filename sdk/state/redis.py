"""Redis (≥ 6.2, or Valkey) as the shared state backend: one server, a master watched by Sentinel, or
a Redis Cluster (the URL's forms and TLS options: sdk/state/redis_url.py).

Two query parameters of the URL are Slipstream's own: `prefix` (default `slipstream`) namespaces the
keys, so several deployments can share one Redis; `timeout_ms` (default 100) bounds every call. The
client (sdk/state/redis_client.py) never retries by itself: a failure goes straight to
`GuardedState`, which decides.

On a Cluster a script may touch the keys of one hash slot only: the keys each script call touches
carry one team's hash tag (`{TEAM}`, sdk/state/backend.py:team_slot), and the calls that gather
several teams' keys (the batched ledger merge, the lease renewal) go as one call per slot.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from sdk.state import redis_scripts
from sdk.state.backend import Admission, Refusal, Settlement
from sdk.state.headroom import Headroom
from sdk.state.redis_client import RedisClient, key_slot
from sdk.state.resp import RespError

LEASE_TTL_S = 30.0  # a dead replica's concurrency slots come back after this
REPLICA_TTL_S = 5.0  # a replica that has not checked in for this long no longer counts
HOLDS_KEEP_S = 32 * 86_400  # a budget's holds set lives as long as the longest spend record (emptied, Redis drops it)
_SCRIPTS = {name: (getattr(redis_scripts, name), hashlib.sha1(getattr(redis_scripts, name).encode()).hexdigest())
            for name in ("ADMIT", "SETTLE", "RENEW", "READ_ENTRIES", "MERGE_ENTRIES")}


def _usd(amount: float) -> str:
    """A USD amount as ADMIT and SETTLE both spell it (a hold's member name carries it)."""
    return f"{amount:.12g}"


@dataclass(frozen=True, slots=True)
class Entries:
    """Expiring entries to merge (the prompt-cache ledger's): (name, value, ttl_s, seconds left)."""

    rows: tuple[tuple[str, str, float, float], ...]


def _evalsha(name: str, keys: list[str], args: list[Any]) -> tuple[Any, ...]:
    return ("EVALSHA", _SCRIPTS[name][1], len(keys), *keys, *args)


def _noscript(reply: Any) -> bool:
    """A restarted Redis (or a Cluster node new to the slot) does not hold the script yet."""
    return isinstance(reply, RespError) and str(reply).startswith("NOSCRIPT")


def _eval(command: tuple[Any, ...]) -> tuple[Any, ...]:
    """An EVALSHA as the EVAL of its script (which also caches it on the node that runs it)."""
    source = next(source for source, sha in _SCRIPTS.values() if sha == command[1])
    return ("EVAL", source, *command[2:])


def by_slot(keys: list[str]) -> list[list[int]]:
    """Positions of `keys` grouped by Cluster hash slot (one script call's keys must share one)."""
    groups: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key_slot(key), []).append(i)
    return list(groups.values())


def split_url(url: str) -> tuple[str, str, float]:
    """(the URL of the server, key prefix, timeout in seconds)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    prefix = query.pop("prefix", "slipstream")
    timeout_s = float(query.pop("timeout_ms", "100")) / 1000
    return urlunsplit(parts._replace(query=urlencode(query))), prefix, timeout_s


class RedisState:
    kind = "redis"

    def __init__(self, url: str, replica_id: str | None = None):
        self.url, self.prefix, self.timeout_s = split_url(url)
        self.client = RedisClient(self.url, self.timeout_s)
        self.replica_id = replica_id or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._flags: dict[str, float] = {}
        self._flag_changes = 0  # a sync that raced a local set/clear keeps the local view for one round
        self._held: dict[str, tuple[tuple[str, str], ...]] = {}  # lease → (set, member) it holds, renewed while it runs
        self.replicas = 1
        self.last_spent: dict[str, float] = {}  # budget record → USD spent, as of the last admission
        self.room = Headroom()  # what the last answers left: admissions far from every limit go ahead

    def key(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    async def _script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """EVALSHA, falling back to EVAL once after a Redis restart emptied its script cache."""
        source, sha = _SCRIPTS[name]
        try:
            return await self.client.execute("EVALSHA", sha, len(keys), *keys, *args)
        except RespError as exc:
            if not _noscript(exc):
                raise
            return await self.client.execute("EVAL", source, len(keys), *keys, *args)

    async def _scripts(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Script calls pipelined, errors in their places; those a restarted Redis (or a Cluster node new
        to the slot) no longer knew are sent again as EVAL."""
        replies = await self.client.pipeline(commands, raise_errors=False)
        lost = [i for i, reply in enumerate(replies) if _noscript(reply)]
        if lost:
            again = await self.client.pipeline([_eval(commands[i]) for i in lost], raise_errors=False)
            for i, reply in zip(lost, again, strict=True):
                replies[i] = reply
        return replies

    def _admit_args(self, admissions: list[Admission], force: bool) -> tuple[list[str], list[Any]]:
        """One ADMIT's keys and arguments, for admissions with the same limits (one, when checked; a
        batch's, when forced)."""
        admission = admissions[0]
        nr, nc = len(admission.rates), len(admission.caps)
        keys = [self.key(r.key) for r in admission.rates] + [self.key(c.key) for c in admission.caps]
        args: list[Any] = [nr, nc, int(admission.budget is not None), LEASE_TTL_S, int(force)]
        for rate in admission.rates:
            args += [float(rate.per_minute), float(rate.cost)]
        args += [n for cap in admission.caps for n in (cap.limit, cap.weight)]
        budget = admission.budget
        if budget is not None:
            keys += [self.key(budget.key), self.key(budget.holds)]
            args += [float(budget.usd), _usd(budget.reserve), HOLDS_KEEP_S]
        if admission.holds:  # held from now (renewed by the check-in); a refusal or a failure lets go
            for each in admissions:  # added to what the lease holds already (a request's limits, then its budget)
                self._held[each.lease] = (*self._held.get(each.lease, ()), *self._holding(each))
        return keys, [*args, *(each.lease for each in admissions)]

    def _holding(self, admission: Admission) -> tuple[tuple[str, str], ...]:
        """The sorted-set members an admitted lease holds: its slots in each cap (a weighted lease's
        named as ADMIT names them), its budget hold."""
        held = tuple((self.key(cap.key), admission.lease if w == 1 else f"{admission.lease}#{w}")
                     for cap in admission.caps for w in range(1, cap.weight + 1))
        budget = admission.budget
        if budget is not None and budget.reserve > 0:
            held += ((self.key(budget.holds), f"{admission.lease}|{_usd(budget.reserve)}"),)
        return held

    def forget(self, lease: str) -> None:
        """Stop renewing what `lease` holds (settled while Redis was away: there it expires)."""
        self._held.pop(lease, None)

    def _admitted(self, admission: Admission, reply: Any) -> Refusal | None:
        if reply[0] != b"ok":
            self._held.pop(admission.lease, None)
            self.room.refused(admission)
            return Refusal(reply[0].decode(), int(reply[1]), float(reply[2]), float(reply[3]))
        spent, nr = float(reply[3]), len(admission.rates)
        if admission.budget is not None:  # what a degraded replica budgets against (sdk/state/guard.py)
            self.last_spent[admission.budget.key] = spent
        self.room.heard(admission, [float(v) for v in reply[4:4 + nr]], [float(v) for v in reply[4 + nr:]], spent)
        return None

    async def admit(self, admission: Admission) -> Refusal | None:
        """Check and charge every limit of `admission` in one script."""
        keys, args = self._admit_args([admission], force=False)
        try:
            reply = await self._script("ADMIT", keys, args)
        except BaseException:
            self._held.pop(admission.lease, None)
            raise
        return self._admitted(admission, reply)

    async def send_batch(self, items: list[Admission | Settlement | Entries]) -> None:
        """The charges of admissions granted ahead (the script's force mode), settlements and ledger
        entries, in one pipelined write: what one batch collected. Those with the same keys go as one
        script call each (leases listed, amounts summed), admissions first, so a lease's admission
        always precedes its settlement; all entries in one call."""
        admitted: dict[tuple[Any, ...], list[Admission]] = {}
        settled: dict[tuple[Any, ...], list[Settlement]] = {}
        rows: list[tuple[str, str, float, float]] = []
        for item in items:
            if isinstance(item, Admission):
                admitted.setdefault((item.rates, item.caps, item.budget), []).append(item)
            elif isinstance(item, Entries):
                rows += item.rows
            else:
                spend = item.spend if item.spend is not None and item.spend.usd else None
                records = tuple(key for key, _ in spend.records) if spend is not None else None  # not their keep: it ticks
                holds = item.budget.key if item.budget is not None and item.budget.reserve > 0 else None
                shape = (item.caps, tuple(rate for rate, _ in item.charges), records, spend and spend.fields, holds)
                settled.setdefault(shape, []).append(item)
        groups = list(admitted.values())
        commands = [_evalsha("ADMIT", *self._admit_args(group, force=True)) for group in groups]
        commands += [_evalsha("SETTLE", *self._settle_args(group)) for group in settled.values()]
        for slot in by_slot([name for name, *_ in rows]):  # a Cluster runs a script on one slot's keys
            commands.append(_evalsha("MERGE_ENTRIES", *self._merge_args([rows[i] for i in slot])))
        try:
            replies = await self._scripts(commands)
        except BaseException:
            for group in groups:
                for admission in group:
                    self._held.pop(admission.lease, None)  # never charged: a degraded replica settles it locally
            raise
        for reply in replies:
            if isinstance(reply, RespError):
                raise reply
        for group, reply in zip(groups, replies, strict=False):
            self._admitted(group[0], reply)

    def _settle_args(self, settlements: list[Settlement]) -> tuple[list[str], list[Any]]:
        """One SETTLE's keys and arguments, for settlements with the same keys: their leases, tokens
        and spend together."""
        first = settlements[0]
        keys = [self.key(k) for k in first.caps] + [self.key(rate.key) for rate, _ in first.charges]
        spend = first.spend
        records = spend.records if spend is not None and spend.usd else ()
        budget = first.budget if first.budget is not None and first.budget.reserve > 0 else None
        args: list[Any] = [len(first.caps), len(first.charges), len(records), int(budget is not None)]
        for i, (rate, _) in enumerate(first.charges):
            args += [float(rate.per_minute), float(sum(each.charges[i][1] for each in settlements))]
        if spend is not None and records:
            keys += [self.key(key) for key, _ in records]
            usd = sum(each.spend.usd for each in settlements if each.spend is not None)
            args += [float(usd), len(spend.fields), *spend.fields, *(int(keep) for _, keep in records)]
        if budget is not None:
            keys += [self.key(budget.key), self.key(budget.holds)]
        for each in settlements:
            self._held.pop(each.lease, None)
        leases = [each.lease for each in settlements] if first.caps or budget is not None else []
        reserves = [_usd(each.budget.reserve) for each in settlements if each.budget is not None] if budget is not None else []
        return keys, [*args, *leases, *reserves]

    async def spend(self, key: str) -> dict[str, float]:
        fields = await self.client.execute("HGETALL", self.key(key))
        return {fields[i].decode(): float(fields[i + 1]) for i in range(0, len(fields), 2)}

    async def add_spend(self, records: list[tuple[str, float, dict[str, float]]]) -> None:
        """Add spend recorded elsewhere (locally, while Redis was away): (key, seconds to keep, fields)."""
        commands: list[tuple[Any, ...]] = []
        for key, keep_s, fields in records:
            commands += [("HINCRBYFLOAT", self.key(key), name, float(usd)) for name, usd in fields.items()]
            commands.append(("EXPIRE", self.key(key), max(1, int(keep_s))))
        await self.client.pipeline(commands)

    async def read_entries(self, names: list[str]) -> list[tuple[bytes, float] | None]:
        """Expiring entries by name: (b"VALUE TTL_S", seconds left), None where there is none."""
        reply = await self._script("READ_ENTRIES", [self.key(name) for name in names], [])
        return [(reply[i], reply[i + 1] / 1000) if reply[i] is not None else None for i in range(0, len(reply), 2)]

    def _merge_args(self, rows: list[tuple[str, str, float, float]]) -> tuple[list[str], list[Any]]:
        """MERGE_ENTRIES for (name, value, ttl_s, seconds left) rows: an entry already there that lives
        longer keeps its life."""
        args: list[Any] = []
        for _, value, ttl_s, left_s in rows:
            args += [value, float(ttl_s), int(left_s * 1000)]
        return [self.key(name) for name, *_ in rows], args

    async def set_flag(self, name: str, until: float) -> None:
        self._flags[name] = until  # seen here at once; by the other replicas at their next sync
        self._flag_changes += 1
        await self.client.execute("HSET", self.key("flags"), name, float(until))

    async def clear_flag(self, name: str) -> None:
        self._flags.pop(name, None)
        self._flag_changes += 1
        await self.client.execute("HDEL", self.key("flags"), name)

    def flags(self) -> Mapping[str, float]:
        return self._flags

    async def claim(self, name: str, ttl_s: float) -> bool:
        reply = await self.client.execute("SET", self.key(f"claim:{name}"), self.replica_id, "NX", "PX", max(1, int(ttl_s * 1000)))
        return reply is not None

    async def sync(self) -> int:
        """One round trip: check in as a live replica, count the live ones, renew this replica's
        leases, and refresh the flag mirror. Returns the replica count."""
        now = time.time()
        changes = self._flag_changes
        replicas = self.key("replicas")
        commands: list[tuple[Any, ...]] = [
            ("ZADD", replicas, now, self.replica_id),
            ("ZREMRANGEBYSCORE", replicas, "-inf", now - REPLICA_TTL_S),
            ("ZCARD", replicas),
            ("HGETALL", self.key("flags")),
        ]
        held = [pair for pairs in self._held.values() for pair in pairs]
        for slot in by_slot([key for key, _ in held]):  # one call per slot: a Cluster's rule for scripts
            pairs = [held[i] for i in slot]
            commands.append(_evalsha("RENEW", [key for key, _ in pairs], [LEASE_TTL_S, *(member for _, member in pairs)]))
        replies = await self._scripts(commands)
        for reply in replies:
            if isinstance(reply, RespError):
                raise reply
        self.replicas = max(1, int(replies[2]))
        flags = replies[3]
        if changes != self._flag_changes:
            return self.replicas  # this replica raised or cleared a flag meanwhile: the snapshot may predate it
        self._flags = {flags[i].decode(): until for i in range(0, len(flags), 2) if (until := float(flags[i + 1])) > now}
        return self.replicas

    async def leave(self) -> None:
        """Stop counting as a live replica (a clean shutdown)."""
        await self.client.execute("ZREM", self.key("replicas"), self.replica_id)

    async def close(self) -> None:
        await self.client.close()
