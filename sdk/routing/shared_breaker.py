"""Breakers every replica sees: each replica judges a target from its own outcomes, and an open
circuit is published as a state flag until its cooldown ends.

A replica that opens a target's breaker raises the flag `breaker:TEAM:TARGET`; every replica reads
flags from its backend's local mirror (refreshed each check-in, 0.5 s), so the hot path asks the
store nothing while circuits are closed. When the cooldown has passed, one probe among all replicas
is claimed through the store; its success clears the flag for everyone, its failure raises it again.
"""

from __future__ import annotations

import time

from sdk.policy import BreakerPolicy
from sdk.routing.breaker import BreakerState, InMemoryBreakerStore
from sdk.state.backend import StateBackend


class SharedBreakerStore:
    def __init__(self, policy: BreakerPolicy, state: StateBackend, scope: str):
        self.policy = policy
        self.local = InMemoryBreakerStore(policy)
        self.state_backend = state
        self.scope = scope

    def _flag(self, key: str) -> str:
        return f"breaker:{self.scope}:{key}"

    async def acquire(self, key: str) -> bool:
        if not self.policy.enabled:
            return True
        flag = self._flag(key)
        until = self.state_backend.flags().get(flag)
        if until is None:
            return await self.local.acquire(key)
        if time.time() < until:
            return False
        return await self.state_backend.claim(f"probe:{flag}", self.policy.cooldown_s)  # one probe, all replicas

    async def record(self, key: str, failed: bool, open_now: bool = False) -> None:
        if not self.policy.enabled:
            return
        flag = self._flag(key)
        flagged = flag in self.state_backend.flags()
        was_open = await self.local.state(key) is BreakerState.OPEN
        await self.local.record(key, failed, open_now)
        if failed and (flagged or (not was_open and await self.local.state(key) is BreakerState.OPEN)):
            await self.state_backend.set_flag(flag, time.time() + self.policy.cooldown_s)
        elif not failed and flagged:
            await self.state_backend.clear_flag(flag)

    async def release(self, key: str) -> None:
        await self.local.release(key)

    async def state(self, key: str) -> BreakerState:
        until = self.state_backend.flags().get(self._flag(key))
        if until is None:
            return await self.local.state(key)
        return BreakerState.OPEN if time.time() < until else BreakerState.HALF_OPEN
