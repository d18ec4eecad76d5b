"""Several API keys for one provider: a 429 or a refused key moves the call to the next key at once.

Rate limits and credentials belong to a key, not to the provider, so a provider given several keys
(`api_key_env: [KEY_A, KEY_B]`) answers a 429 on one of them by sending the same call with the
next, without a backoff (Bifrost rotates keys the same way). The key that was refused cools down
for the server's retry-after hint (one second without one; five minutes for a 401/403), and
later calls try cooled-down keys last; with a shared state backend every replica does, except after
a 403, or a 401 for a scope a restricted key lacks, which are about what one team's request asked
for and cool the key for that team only. A 429
the request caused alone (OpenAI's "Request too large for … on tokens per min": more tokens than the
key may take in a minute) moves the call on and cools nothing: the key is not busy, and the next
call fits. A key is never skipped outright: when every key is cooling
down the call still goes out, and the provider's own 429 reaches the router, which backs off.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping

from sdk.errors import lacks_scope, too_large_for_a_minute
from sdk.routing.backoff import retry_after
from sdk.state import in_background
from sdk.state.backend import StateBackend

ROTATE_STATUSES = frozenset({401, 403, 429})
_RATE_LIMIT_COOLDOWN_S = 1.0  # a 429 without a hint
_BAD_KEY_COOLDOWN_S = 300.0  # a 401/403: this key is wrong here, not busy


class KeyRing:
    def __init__(self, keys: tuple[str, ...], state: StateBackend | None = None):
        if not keys:
            raise ValueError("a key ring needs at least one key")
        self.keys = keys
        self._cool_until = [0.0] * len(keys)
        # With a shared backend, cooldowns are flags every replica sees (named by a digest, never the key).
        self._state = state if len(keys) > 1 else None
        self._flags = tuple(f"key:{hashlib.sha256(key.encode()).hexdigest()[:16]}" for key in keys) if self._state else ()

    def order(self) -> list[int]:
        """Key indexes to try, in order: ready keys first (in the policy's order), then by cooldown end."""
        if len(self.keys) == 1:
            return [0]
        now = time.monotonic()
        cool = self._cool_until
        if self._state is not None:
            flags, wall = self._state.flags(), time.time()
            cool = [max(until, now + flags.get(flag, 0.0) - wall) for until, flag in zip(cool, self._flags, strict=True)]
        return sorted(range(len(self.keys)), key=lambda i: (max(cool[i], now), i))

    def refused(self, index: int, status: int, headers: Mapping[str, str], body: bytes = b"") -> None:
        """Key `index` got `status` (one of ROTATE_STATUSES) and `body`: cool it down, unless the
        request alone was over the key's per-minute limit."""
        if status == 429 and too_large_for_a_minute(body):
            return  # one team's oversized request would take the key from every team and replica
        if status == 429:
            cooldown = retry_after(headers)
            cooldown = _RATE_LIMIT_COOLDOWN_S if cooldown is None else cooldown
        else:
            cooldown = _BAD_KEY_COOLDOWN_S
        self._cool_until[index] = max(self._cool_until[index], time.monotonic() + cooldown)
        # A 403 refused what this request asked for (a model, a resource), and a 401 for a missing
        # scope an API the key may not use, not the key: it cools the key for this ring (this team)
        # only, never for every team and replica sharing the key.
        if self._state is not None and status != 403 and not (status == 401 and lacks_scope(body)):
            in_background(self._state.set_flag(self._flags[index], time.time() + cooldown))
