"""The prompt-cache ledger shared by replicas through the state backend (Redis).

A provider's prompt cache is one per upstream workspace, whichever replica sent the request that
wrote it; so a prefix cached through one replica must be predicted as a read by any other. Each
replica keeps its own `Ledger` (sdk/promptcache/ledger.py) for the synchronous planning and mirrors
the entries it learns into Redis: one key per (team, provider cache scope, prefix digest), whose
value is the tokens through the prefix and the entry's TTL, and whose Redis expiry is the entry's
(the provider's lifetime: 5 minutes or 1 hour for Anthropic, 5 minutes for OpenAI, refreshed by
every read), so Redis forgets an entry exactly when the provider would.

Before planning, `pull` reads in one round trip the entries this replica does not already hold
readable, for the prefixes long enough to be cached at all (a short prompt costs nothing); after the
response has started, `push` merges what the request wrote or refreshed, with the state backend's
next background batch (sdk/state/guard.py). Times
travel as "seconds left" on Redis' clock, so replicas' clocks never have to agree.

Only readable entries are shared: a sibling waiting for an in-flight write (warm fan-out) waits only
for writers on its own replica, and miss causes are explained from each replica's own history. While
Redis is away the guard answers DOWN and the local ledger goes on alone.
"""

from __future__ import annotations

import time
from hashlib import blake2b

from sdk.promptcache.ledger import Entry, Scope
from sdk.promptcache.optimizer import Plan, ScopeKey
from sdk.state.guard import DOWN, GuardedState

MAX_KEYS = 256  # prefixes asked per request: the longest ones (a long conversation has more blocks)


class SharedLedger:
    def __init__(self, team: str, state: GuardedState):
        self.team = team
        self.state = state
        self._scopes: dict[ScopeKey, str] = {}

    def _name(self, scope: ScopeKey, digest: int) -> str:
        prefix = self._scopes.get(scope)
        if prefix is None:
            if len(self._scopes) >= 1024:  # model names and cache keys come from clients: keep it bounded
                self._scopes.clear()
            # The team and scope folded into one digest: names in it may hold any character.
            raw = "\x00".join((self.team, *scope)).encode("utf-8", "surrogatepass")
            # In braces: a Cluster hash tag, so one read (a script over a scope's prefixes) stays on one slot.
            prefix = self._scopes[scope] = f"pc:{{{blake2b(raw, digest_size=8).hexdigest()}}}:"
        return f"{prefix}{digest:016x}"

    async def pull(self, scope: Scope, key: ScopeKey, digests: list[int]) -> None:
        """Merge into `scope` the entries other replicas shared for these prefixes."""
        now = time.time()
        wanted = [d for d in digests[-MAX_KEYS:] if not ((entry := scope.live(d, now)) is not None and entry.readable)]
        if not wanted:
            return
        redis = self.state.shared
        found = await self.state.try_shared(lambda: redis.read_entries([self._name(key, d) for d in wanted]))
        if found is DOWN:
            return
        now = time.time()
        for digest, item in zip(wanted, found, strict=True):
            if item is None:
                continue
            value, left_s = item
            pos, ttl = value.split()
            expires = now + left_s
            entry = scope.live(digest, now)
            if entry is None:
                scope.entries[digest] = Entry(int(pos), float(ttl), expires, True, None)
                continue
            entry.ttl, entry.expires = max(entry.ttl, float(ttl)), max(entry.expires, expires)
            if not entry.readable:  # another replica's writer got there first: its entry is readable
                entry.readable = True
                if entry.ready is not None:
                    entry.ready.set()

    def push(self, key: ScopeKey, plan: Plan) -> None:
        """Share, in the background, the entries this request wrote or refreshed (the read one included)."""
        entries: dict[int, Entry] = {w.key: w.entry for w in plan.writes if plan.scope.entries.get(w.key) is w.entry}
        if plan.prediction.hit >= 0:
            digest = plan.layout.chain[plan.prediction.hit]
            if (hit := plan.scope.entries.get(digest)) is not None:
                entries[digest] = hit
        now = time.time()
        rows = [(self._name(key, digest), str(entry.pos), entry.ttl, entry.expires - now)
                for digest, entry in entries.items() if entry.readable and entry.expires > now]
        if rows:
            self.state.merge_entries(rows)
