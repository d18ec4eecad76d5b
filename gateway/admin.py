"""The admin key: one check for the operator's endpoints (`/metrics` when a key is set, the status page).

The key comes from `SLIPSTREAM_ADMIN_KEY`, `slipstream serve --admin-key-file PATH` or (warned about:
argv is public) `--admin-key KEY`, and is sent as `Authorization: Bearer KEY`. It is no team key: a
team key never opens these endpoints, and the admin key opens nothing else. Use `admin_guard` as a
Litestar guard on any handler that needs it.

Guessing is throttled per client address (`LoginThrottle`): after 5 wrong keys in a row each further
attempt waits twice as long as the last (1 s, 2 s, … up to 15 min), answered 429 with Retry-After
without looking at the key; every wrong key is counted and logged (gateway/refusals.py).

A browser cannot add that header to a page it opens, so the status page also takes the key once in a
login form and answers with a session token in a cookie (gateway/ui/auth.py). The token is
`EXPIRY.ID.MAC`, an HMAC of its expiry and a random id under the key: every worker and replica with the same key
accepts it without shared state, and changing the key ends every session.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.handlers.base import BaseRouteHandler

from gateway.refusals import auth_failure, client_address
from sdk.errors import AuthenticationError, RateLimitedError

ENV = "SLIPSTREAM_ADMIN_KEY"


@dataclass
class LoginThrottle:
    """Wrong admin keys per client address. After `free_failures` in a row, the next attempt must wait
    `base_s * 2 ** (failures - free_failures)` (at most `max_s`) after the last failure; a right key
    forgets the address, and so does `max_s` without a failure. Per process: with N workers or
    replicas a guesser gets N times the free attempts, and no more than that."""

    free_failures: int = 5
    base_s: float = 1.0
    max_s: float = 900.0
    max_sources: int = 10_000  # oldest forgotten first: many addresses cannot grow it without bound
    clock: Callable[[], float] = time.monotonic
    _failures: dict[str, tuple[int, float]] = field(default_factory=dict)  # address -> (wrong keys in a row, last at)

    def wait_s(self, source: str) -> float:
        """Seconds `source` must still wait before its key is looked at (0: now)."""
        count, last = self._failures.get(source, (0, -math.inf))
        now = self.clock()
        if now - last > self.max_s:
            self._failures.pop(source, None)
            return 0.0
        if count < self.free_failures:
            return 0.0
        return max(0.0, last + min(self.max_s, self.base_s * 2.0 ** (count - self.free_failures)) - now)

    def failed(self, source: str) -> None:
        count, _ = self._failures.pop(source, (0, 0.0))  # re-inserted last: oldest first
        self._failures[source] = (count + 1, self.clock())
        while len(self._failures) > self.max_sources:
            del self._failures[next(iter(self._failures))]

    def succeeded(self, source: str) -> None:
        self._failures.pop(source, None)


class AdminKey:
    """An optional admin key; `required` is False when none is configured (the endpoints stay open)."""

    def __init__(self, key: str | None, throttle: LoginThrottle | None = None):
        self._digest = hashlib.sha256(key.encode()).digest() if key else None
        self.throttle = throttle or LoginThrottle()

    @classmethod
    def from_env(cls, key: str | None = None) -> AdminKey:
        return cls(key if key is not None else os.environ.get(ENV) or None)

    @property
    def required(self) -> bool:
        return self._digest is not None

    def check(self, authorization: str | None, source: str, path: str) -> None:
        """Raise AuthenticationError unless `authorization` is `Bearer KEY` with the admin key
        (RateLimitedError while `source` is throttled)."""
        if self._digest is None:
            return
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            auth_failure("admin", "missing", source, path)
            raise AuthenticationError("this endpoint needs the admin key: send 'Authorization: Bearer ADMIN_KEY'")
        self.verify(given, source, path)

    def verify(self, given: str, source: str, path: str) -> None:
        """Raise RateLimitedError while `source` is throttled (the key is not looked at), else
        AuthenticationError unless `given` is the admin key; wrong keys are counted, logged and throttled."""
        self.refuse_if_throttled(source, path)
        if not self.accepts(given):
            self.throttle.failed(source)
            auth_failure("admin", "invalid", source, path)
            raise AuthenticationError("invalid admin key")
        self.throttle.succeeded(source)

    def refuse_if_throttled(self, source: str, path: str) -> None:
        wait = self.throttle.wait_s(source)
        if wait > 0:
            auth_failure("admin", "throttled", source, path)
            retry_after = str(math.ceil(wait))
            raise RateLimitedError(f"too many wrong admin keys from {source}: try again in {retry_after} s",
                                   headers={"retry-after": retry_after})

    def accepts(self, given: str) -> bool:
        """Whether `given` is the admin key (False when none is configured)."""
        if self._digest is None:
            return False
        return hmac.compare_digest(hashlib.sha256(given.strip().encode()).digest(), self._digest)

    def session_token(self, ttl_s: float, now: float | None = None) -> str:
        """A token that `check_session` accepts until `ttl_s` from now; only with a key configured."""
        assert self._digest is not None, "no admin key: no sessions"
        # A random id: each sign-in is a session of its own, which logout can revoke alone.
        session = f"{int((time.time() if now is None else now) + ttl_s)}.{secrets.token_hex(8)}"
        return f"{session}.{self._mac(session)}"

    def check_session(self, token: str | None, now: float | None = None) -> bool:
        if self._digest is None or not token:
            return False
        session, _, mac = token.rpartition(".")
        expiry, _, nonce = session.partition(".")
        if not expiry.isdigit() or not nonce or not hmac.compare_digest(mac, self._mac(session)):
            return False
        return int(expiry) > (time.time() if now is None else now)

    def _mac(self, session: str) -> str:
        assert self._digest is not None
        return hmac.new(self._digest, f"slipstream-ui:{session}".encode(), hashlib.sha256).hexdigest()


def admin_guard(connection: ASGIConnection[Any, Any, Any, State], _: BaseRouteHandler) -> None:
    """Litestar guard: the app's `state.admin_key` must accept the request's Authorization header."""
    admin: AdminKey = connection.app.state.admin_key
    admin.check(connection.headers.get("authorization"), client_address(connection.scope), connection.scope["path"])
