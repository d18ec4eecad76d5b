"""Stored responses in Redis, so any replica continues a conversation another replica started.

Keys, under `PREFIX:responses:{TEAM}:` (the team's hash tag: on a Redis Cluster all of a team's
keys share one slot, so each script runs where they all are): `r:ID` a hash per response (`data`: the record as JSON,
`prev`, `depth`, `chain`, `size`), `items` a hash of item → the response holding it (for
`item_reference`) and `ritems` of response → its items (so a response dropped after its own key
expired still takes its items along), `order` a sorted set of the team's responses by last use,
`sizes` and `bytes` their sizes and total. Records expire with the team's retention, and the
team's hashes with its last write; writing a turn renews its chain, a key per response (items
were a key each, renewed one by one: 400,000 in a 40-turn conversation of 10,000 items a turn
held Redis for 150 ms per turn; `i:ITEM` keys and the `items` field written before are still
read and dropped, no longer renewed). A write, its eviction over the team's quota and each
stretch of a chain's walk run as one Lua script (atomic), with the same rules as the SQLite store
(store.py).

The store has its own connection, with a bound for bulk data (`_BULK_TIMEOUT_S`): megabytes of
conversation never queue the limits' calls behind them on the state backend's connection, nor trip
its 100 ms guard. While Redis is unreachable (the state guard is open, or a call here fails)
responses are stored in and read from the replica's own SQLite store, and a lookup Redis misses is
tried there too: a conversation begun during an outage continues on the replica that began it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import orjson

from sdk.responses.sqlite_store import SQLiteResponseStore
from sdk.responses.store import MAX_CHAIN, StoredResponse, StoreLimits, pick_items
from sdk.state.backend import team_slot
from sdk.state.guard import GuardedState
from sdk.state.redis_client import RedisClient
from sdk.state.resp import Reply, RespError

log = logging.getLogger("slipstream.responses")
_BULK_TIMEOUT_S = 10.0
# Item ids one script looks up. A script holds Redis, which every replica and team shares, until it
# ends: 300,000 references in one held it for most of a second (other teams' calls timed out);
# 1,000 take about a millisecond.
ITEMS_PER_SCRIPT = 1000
# Bytes of records one script reads (of a chain, or those an item lookup needs): a 50 MiB conversation read in one held Redis for
# 200 ms, past every other caller's timeout (a team's quota allows 1 GiB); 4 MiB take about 15 ms.
CHAIN_BYTES_PER_SCRIPT = 4 << 20
# Records of a chain one script renews when a turn is written, or reads: a 10,000-turn chain renewed
# in the turn's own script held Redis for 119 ms (past every other caller's timeout, and growing with
# each turn), read in one (small records stay under the byte budget) for 58 ms; 1,000 take 3-6 ms.
CHAIN_RECORDS_PER_SCRIPT = 1000
_DOWN = object()

_DROP = """
local base = ARGV[1]
local order, sizes, total, index, listed = base .. 'order', base .. 'sizes', base .. 'bytes', base .. 'items', base .. 'ritems'
local function drop(rid)
  local key = base .. 'r:' .. rid
  local items = redis.call('HGET', listed, rid) or redis.call('HGET', key, 'items')
  if items then
    for item in string.gmatch(items, '%S+') do
      if redis.call('HGET', index, item) == rid then redis.call('HDEL', index, item) end
      if redis.call('GET', base .. 'i:' .. item) == rid then redis.call('DEL', base .. 'i:' .. item) end
    end
  end
  redis.call('HDEL', listed, rid)
  local size = redis.call('HGET', sizes, rid)
  if size then
    redis.call('DECRBY', total, size)
    redis.call('HDEL', sizes, rid)
  end
  redis.call('ZREM', order, rid)
  return redis.call('DEL', key)
end
"""

# ARGV: base, first id, now, its rank, count, ttl_s. Renews up to `count` records of a chain from
# the first id back along `prev`: each ranked a microsecond later than the one after it in the
# chain (so among responses last used together the latest turn is evicted first) and kept `ttl_s`
# more. Returns {the next id to renew ('' at the chain's start), its rank}.
_RENEW = """
local base, cur, now, d, count, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local order = base .. 'order'
for _ = 1, count do
  local k = base .. 'r:' .. cur
  local p = redis.call('HGET', k, 'prev')
  if not p then return {'', d} end
  redis.call('ZADD', order, now + d / 1000000, cur)
  redis.call('EXPIRE', k, ttl)
  if p == '' then return {'', d + 1} end
  cur, d = p, d + 1
end
return {cur, d}
"""

# ARGV: base, id, previous ('' for none), data, ttl_s, max_entries, max_bytes, now, item ids...
# Writes the record (ranked `now`: its chain was renewed just before, `_RENEW`, each ancestor a
# microsecond later), drops what expired, evicts least recently used responses last used before
# `now` (so never this chain) until the team is within its quota. Returns {depth, chain bytes}.
_PUT = _DROP + """
local id, prev, data = ARGV[2], ARGV[3], ARGV[4]
local ttl, max_n, max_b, now = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local size = string.len(data)
local depth, chain = 1, size
if prev ~= '' then
  local p = redis.call('HMGET', base .. 'r:' .. prev, 'depth', 'chain')
  if p[1] then depth, chain = tonumber(p[1]) + 1, tonumber(p[2]) + size end
end
drop(id)
local key = base .. 'r:' .. id
local items = {}
for i = 9, #ARGV do
  items[#items + 1] = ARGV[i]
  redis.call('HSET', index, ARGV[i], id)
end
redis.call('HSET', listed, id, table.concat(items, ' '))
redis.call('HSET', key, 'data', data, 'prev', prev, 'depth', depth, 'chain', chain, 'size', size)
redis.call('HSET', sizes, id, size)
redis.call('INCRBY', total, size)
local keep = {[id] = true, [prev] = true}
redis.call('ZADD', order, now, id)
redis.call('EXPIRE', key, ttl)
for _, rid in ipairs(redis.call('ZRANGEBYSCORE', order, '-inf', now - ttl)) do drop(rid) end
local n, b = redis.call('ZCARD', order), tonumber(redis.call('GET', total) or '0')
while n > max_n or b > max_b do
  local evicted = false
  for _, rid in ipairs(redis.call('ZRANGEBYSCORE', order, '-inf', '(' .. ARGV[8], 'LIMIT', 0, 64)) do
    if n <= max_n and b <= max_b then break end
    if not keep[rid] then
      local s = tonumber(redis.call('HGET', sizes, rid) or '0')
      drop(rid)
      n, b, evicted = n - 1, b - s, true
    end
  end
  if not evicted then break end
end
for _, k in ipairs({order, sizes, total, index, listed}) do redis.call('EXPIRE', k, ttl) end
return {depth, chain}
"""

_DELETE = _DROP + "return drop(ARGV[2])"

# ARGV: base, id, byte budget, count. Returns data, depth, chain for each record from `id` back
# along `prev`, newest first, until the chain's first record, or the records read reach the budget
# or `count` (the caller goes on from the last one's `prev`).
_CHAIN = """
local base, cur, budget, out, size = ARGV[1], ARGV[2], tonumber(ARGV[3]), {}, 0
for _ = 1, tonumber(ARGV[4]) do
  local r = redis.call('HMGET', base .. 'r:' .. cur, 'data', 'prev', 'depth', 'chain')
  if not r[1] then break end
  out[#out + 1] = r[1]
  out[#out + 1] = r[3]
  out[#out + 1] = r[4]
  size = size + string.len(r[1])
  if r[2] == '' or size >= budget then break end
  cur = r[2]
end
return out
"""

# ARGV: base, item ids. Returns the (item, owning response) pairs found, flat. Up to ITEMS_PER_SCRIPT items.
_ITEMS = """
local base, out = ARGV[1], {}
for i = 2, #ARGV do
  local owner = redis.call('HGET', base .. 'items', ARGV[i]) or redis.call('GET', base .. 'i:' .. ARGV[i])
  if owner then
    out[#out + 1] = ARGV[i]
    out[#out + 1] = owner
  end
end
return out
"""

# ARGV: base, budget, response ids. Returns {examined, flat}: flat holds (id, data, depth, chain) of each
# of the first `examined` ids still stored, read until about `budget` bytes (at least one id): the
# records an item lookup needs may add up to the team's quota (1 GiB), and a script holds Redis.
_RECORDS = """
local base, budget, out, size, examined = ARGV[1], tonumber(ARGV[2]), {}, 0, 0
for i = 3, #ARGV do
  if size >= budget then break end
  examined = examined + 1
  local r = redis.call('HMGET', base .. 'r:' .. ARGV[i], 'data', 'depth', 'chain')
  if r[1] then
    out[#out + 1] = ARGV[i]
    out[#out + 1] = r[1]
    out[#out + 1] = r[2]
    out[#out + 1] = r[3]
    size = size + string.len(r[1])
  end
end
return {examined, out}
"""


def _record(data: bytes, depth: Any, chain_bytes: Any) -> StoredResponse:
    return StoredResponse(**{**orjson.loads(data), "depth": int(depth), "chain_bytes": int(chain_bytes)})


class RedisResponseStore:
    def __init__(self, state: GuardedState, fallback: SQLiteResponseStore, limits: Mapping[str, StoreLimits] | None = None):
        self.state = state
        self.redis = state.shared
        self.client = RedisClient(state.shared.url, _BULK_TIMEOUT_S)
        self.fallback = fallback
        self.limits: Mapping[str, StoreLimits] = limits if limits is not None else {}

    def _base(self, team: str) -> str:
        return self.redis.key(f"responses:{team_slot(team)}:")

    async def _call(self, *args: Any) -> Reply:
        """One command's reply, or `_DOWN` (the caller uses the replica's own store)."""
        if not self.state.up:
            return _DOWN
        try:
            async with asyncio.timeout(_BULK_TIMEOUT_S):
                return await self.client.execute(*args)
        except (RespError, OSError, TimeoutError) as exc:
            log.warning("response store: Redis %s failed (%s); this replica's own store answers", args[0], type(exc).__name__)
            return _DOWN

    async def _eval(self, script: str, base: str, *args: Any) -> Reply:
        """A script over the team's keys under `base`: it names one of them (`order`) as its key, so a
        Cluster runs it on the node of the team's slot, where every key it builds from `base` lives."""
        return await self._call("EVAL", script, 1, base + "order", base, *args)

    async def put(self, record: StoredResponse) -> None:
        limits = self.limits.get(record.team, StoreLimits())
        data = orjson.dumps({k: v for k, v in asdict(record).items() if k not in ("depth", "chain_bytes")})
        item_ids = sorted({item_id for item_id, _ in record.items()})
        base, ttl, now = self._base(record.team), max(1, int(limits.ttl_s)), f"{time.time():.6f}"
        cursor, rank = record.previous or "", 1
        while cursor and rank < MAX_CHAIN:  # the chain first, a script at a time: Redis answers others between them
            renewed = await self._eval(_RENEW, base, cursor, now, rank, CHAIN_RECORDS_PER_SCRIPT, ttl)
            if not isinstance(renewed, list):
                break
            cursor, rank = renewed[0].decode(), int(renewed[1])
        stored = await self._eval(_PUT, base, record.id, record.previous or "", data, ttl, limits.max_entries,
                                  limits.max_bytes, now, *item_ids)
        if not isinstance(stored, list):  # Redis is down
            await self.fallback.put(record)
            return
        record.depth, record.chain_bytes = int(stored[0]), int(stored[1])

    async def get(self, team: str, response_id: str) -> StoredResponse | None:
        raw = await self._call("HMGET", self._base(team) + "r:" + response_id, "data", "depth", "chain")
        if not isinstance(raw, list) or raw[0] is None:
            return await self.fallback.get(team, response_id)
        return _record(*raw)

    async def chain_bytes(self, team: str, response_id: str) -> int:
        raw = await self._call("HGET", self._base(team) + "r:" + response_id, "chain")
        return int(raw) if isinstance(raw, bytes) else await self.fallback.chain_bytes(team, response_id)

    async def chain(self, team: str, response_id: str) -> list[StoredResponse]:
        newest_first: list[StoredResponse] = []
        cursor: str | None = response_id
        while cursor is not None and len(newest_first) < MAX_CHAIN:  # a script at a time, each about a budget's bytes
            raw = await self._eval(_CHAIN, self._base(team), cursor, CHAIN_BYTES_PER_SCRIPT, CHAIN_RECORDS_PER_SCRIPT)
            if not isinstance(raw, list) or not raw:
                break
            newest_first += [_record(*raw[i:i + 3]) for i in range(0, len(raw), 3)]
            cursor = newest_first[-1].previous
        found = newest_first[::-1]
        rest = found[0].previous if found else response_id
        if rest is not None:  # begun, or continued, while Redis was down
            found = [*(await self.fallback.chain(team, rest)), *found]
        return found

    async def _owners(self, team: str, item_ids: list[str]) -> dict[str, str]:
        """item id → the id of the team's record holding it, for the ids Redis holds."""
        owners: dict[str, str] = {}
        for start in range(0, len(item_ids), ITEMS_PER_SCRIPT):
            raw = await self._eval(_ITEMS, self._base(team), *item_ids[start:start + ITEMS_PER_SCRIPT])
            if not isinstance(raw, list):
                break
            owners |= {raw[i].decode(): raw[i + 1].decode() for i in range(0, len(raw), 2)}
        return owners

    async def item_bytes(self, team: str, item_ids: list[str]) -> int:
        if not item_ids:
            return 0
        owners = await self._owners(team, item_ids)
        holders = list(dict.fromkeys(owners.values()))
        sizes = await self._call("HMGET", self._base(team) + "sizes", *holders) if holders else []
        held = sum(int(size) for size in sizes if isinstance(size, bytes)) if isinstance(sizes, list) else 0
        missing = [i for i in item_ids if i not in owners]
        return held + (await self.fallback.item_bytes(team, missing) if missing else 0)

    async def find_items(self, team: str, item_ids: list[str]) -> dict[str, tuple[StoredResponse, dict[str, Any]]]:
        if not item_ids:
            return {}
        records: dict[str, StoredResponse] = {}
        owners = await self._owners(team, item_ids)
        wanted = list(dict.fromkeys(owners.values()))
        while wanted:  # a script at a time, each about a budget's bytes
            raw = await self._eval(_RECORDS, self._base(team), CHAIN_BYTES_PER_SCRIPT, *wanted[:ITEMS_PER_SCRIPT])
            if not isinstance(raw, list) or not raw:
                break
            examined, flat = int(raw[0]), raw[1]
            records |= {flat[i].decode(): _record(*flat[i + 1:i + 4]) for i in range(0, len(flat), 4)}
            wanted = wanted[examined:]
        found = pick_items(records, owners)
        missing = [i for i in item_ids if i not in found]
        return {**(await self.fallback.find_items(team, missing) if missing else {}), **found}

    async def delete(self, team: str, response_id: str) -> bool:
        removed = await self._eval(_DELETE, self._base(team), response_id)
        local = await self.fallback.delete(team, response_id)
        return (isinstance(removed, int) and removed > 0) or local

    async def close(self) -> None:
        await self.client.close()
