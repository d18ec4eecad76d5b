"""Lua scripts for the Redis backend: each request's check-and-charge and its settlement run
atomically inside Redis, in one round trip each, on the server's clock (replicas' clocks never meet).

Numbers go back as strings: Redis truncates Lua numbers to integers in replies.
"""

from __future__ import annotations

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
"""

_REFILL = """
local function level_of(key, per_minute, now)
  local s = redis.call('HMGET', key, 'v', 't')
  if not s[1] then return per_minute end
  return math.min(per_minute, tonumber(s[1]) + (now - tonumber(s[2])) * per_minute / 60)
end
"""

# KEYS: rate buckets (nr), cap lease sets (nc), budget record and its holds (2 × nb: 0|1)
# ARGV: nr, nc, nb, lease_ttl_s, force, then per rate (per_minute, cost), per cap (limit, weight), budget usd,
# reserve (USD each lease holds while in flight) and keep_s (the record's life),
# then the leases: one for a checked admission; with force (charge without checking: admissions the
# replica granted ahead, sdk/state/headroom.py), every lease of a batch whose limits are the same,
# each charged. Admitted: {'ok', '0', '0', spent, each bucket's level after, each cap's leases after},
# where spent counts what requests in flight hold.
# A lease of weight w takes w slots: its members LEASE, LEASE#2 .. LEASE#w, added, renewed and so
# expiring together (SETTLE removes the #-members until one is missing).
# Holds: a sorted set of "LEASE|USD" by expiry (renewed with the leases) and their sum in the record's
# `held` field; a dead replica's holds expire like its leases, found in O(expired) at the next admission.
ADMIT = _NOW + _REFILL + """
local nr, nc, nb = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl, force = tonumber(ARGV[4]), ARGV[5] == '1'
local a = 6
local first = a + 2 * nr + 2 * nc + 3 * nb
local k = #ARGV - first + 1
local held, weights = {}, {}
for i = 1, nc do
  local key = KEYS[nr + i]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  held[i] = redis.call('ZCARD', key)
  weights[i] = tonumber(ARGV[a + 2 * nr + 2 * i - 1])
  if not force and held[i] + weights[i] > tonumber(ARGV[a + 2 * nr + 2 * i - 2]) then
    return {'cap', tostring(i - 1), '1', tostring(held[i])}
  end
end
local levels = {}
for i = 1, nr do
  local per, cost = tonumber(ARGV[a + 2 * i - 2]), tonumber(ARGV[a + 2 * i - 1])
  local level = level_of(KEYS[i], per, now)
  local need = cost
  if need <= 0 then need = 1e-9 end
  if not force and level < need then return {'rate', tostring(i - 1), tostring((need - level) * 60 / per), tostring(level)} end
  levels[i] = level - cost * k
end
local spent = 0
if nb == 1 then
  local record, holds = KEYS[nr + nc + 1], KEYS[nr + nc + 2]
  local gone = redis.call('ZRANGEBYSCORE', holds, '-inf', now)
  for _, member in ipairs(gone) do
    redis.call('HINCRBYFLOAT', record, 'held', -tonumber(string.match(member, '|([^|]+)$')))
  end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', holds, '-inf', now) end
  if redis.call('ZCARD', holds) == 0 then redis.call('HDEL', record, 'held') end  -- no float residue
  local s = redis.call('HMGET', record, 'total', 'held')
  spent = tonumber(s[1] or '0') + tonumber(s[2] or '0')
  local b = a + 2 * nr + 2 * nc
  if not force and spent >= tonumber(ARGV[b]) then return {'budget', '0', '0', tostring(spent)} end
  local reserve = tonumber(ARGV[b + 1])
  if reserve > 0 then
    for j = first, #ARGV do redis.call('ZADD', holds, now + ttl, ARGV[j] .. '|' .. ARGV[b + 1]) end
    redis.call('HINCRBYFLOAT', record, 'held', reserve * k)
    spent = spent + reserve * k
    local keep = tonumber(ARGV[b + 2])
    redis.call('EXPIRE', holds, keep)
    if redis.call('TTL', record) < 0 then redis.call('EXPIRE', record, keep) end
  end
end
local out = {'ok', '0', '0', tostring(spent)}
for i = 1, nr do
  redis.call('HSET', KEYS[i], 'v', tostring(levels[i]), 't', tostring(now))
  redis.call('EXPIRE', KEYS[i], 120)
  out[#out + 1] = tostring(levels[i])
end
for i = 1, nc do
  for j = first, #ARGV do
    redis.call('ZADD', KEYS[nr + i], now + ttl, ARGV[j])
    for w = 2, weights[i] do redis.call('ZADD', KEYS[nr + i], now + ttl, ARGV[j] .. '#' .. w) end
  end
  redis.call('EXPIRE', KEYS[nr + i], math.ceil(ttl) * 2)
  out[#out + 1] = tostring(held[i] + k * weights[i])
end
return out
"""

# KEYS: cap lease sets (nc), token buckets (nr), spend records (ns), budget record and its holds (2 × nh: 0|1)
# ARGV: nc, nr, ns, nh, then per bucket (per_minute, amount), then usd, nf, fields..., keep_s per record,
# then the leases that end (the settlements of a batch with the same keys, their amounts summed) and,
# with nh, each lease's reserve as the admission sent it: its hold is released
SETTLE = _NOW + _REFILL + """
local nc, nr, ns, nh = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local a = 5
for i = 1, nr do
  local key, per, amount = KEYS[nc + i], tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local level = level_of(key, per, now)
  redis.call('HSET', key, 'v', tostring(level - amount), 't', tostring(now))
  redis.call('EXPIRE', key, 120)
  a = a + 2
end
if ns > 0 then
  local usd, nf = ARGV[a], tonumber(ARGV[a + 1])
  local fields = {}
  for f = 1, nf do fields[f] = ARGV[a + 1 + f] end
  a = a + 2 + nf
  for i = 1, ns do
    local key = KEYS[nc + nr + i]
    for f = 1, nf do redis.call('HINCRBYFLOAT', key, fields[f], usd) end
    if redis.call('TTL', key) < 0 then redis.call('EXPIRE', key, tonumber(ARGV[a + i - 1])) end
  end
  a = a + ns
end
local m = (#ARGV - a + 1) / (1 + nh)
for i = 1, nc do
  for j = a, a + m - 1 do
    redis.call('ZREM', KEYS[i], ARGV[j])
    local w = 2  -- a weighted lease's other slots (ADMIT)
    while redis.call('ZREM', KEYS[i], ARGV[j] .. '#' .. w) == 1 do w = w + 1 end
  end
end
if nh == 1 then
  local record, holds = KEYS[nc + nr + ns + 1], KEYS[nc + nr + ns + 2]
  for j = a, a + m - 1 do
    if redis.call('ZREM', holds, ARGV[j] .. '|' .. ARGV[j + m]) == 1 then
      redis.call('HINCRBYFLOAT', record, 'held', -tonumber(ARGV[j + m]))
    end
  end
end
return false
"""

# KEYS: lease sets; ARGV: lease_ttl_s, then one lease per key. Renews this replica's live leases.
RENEW = _NOW + """
local ttl = tonumber(ARGV[1])
for i = 1, #KEYS do redis.call('ZADD', KEYS[i], 'XX', now + ttl, ARGV[i + 1]) end
return false
"""

# Expiring entries (the prompt-cache ledger, sdk/promptcache/shared_ledger.py), timed by Redis alone:
# each replica sends and receives time left, never its own wall clock.
# KEYS: entries. Returns per key: its value (or nil) and its milliseconds left.
READ_ENTRIES = """
local out = {}
for i, key in ipairs(KEYS) do
  out[2 * i - 1] = redis.call('GET', key)
  out[2 * i] = redis.call('PTTL', key)
end
return out
"""

# KEYS: entries. ARGV per key: value, ttl_s, ms left; stored as "VALUE TTL_S". What lives longer wins:
# the larger TTL (a 1h write over a 5m one) and the later expiry; the value is the newest.
MERGE_ENTRIES = """
for i, key in ipairs(KEYS) do
  local value, ttl, ms = ARGV[3 * i - 2], tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i])
  local old = redis.call('GET', key)
  if old then
    local old_ttl = tonumber(string.match(old, ' (%S+)$'))
    if old_ttl and old_ttl > ttl then ttl = old_ttl end
    local left = redis.call('PTTL', key)
    if left > ms then ms = left end
  end
  if ms > 0 then redis.call('SET', key, value .. ' ' .. ttl, 'PX', math.floor(ms)) end
end
return #KEYS
"""
