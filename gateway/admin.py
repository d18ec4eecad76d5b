"""The admin key: one check for the operator's endpoints (`/metrics` when a key is set, the status page).

The key comes from `slipstream serve --admin-key KEY` or `SLIPSTREAM_ADMIN_KEY` and is sent as
`Authorization: Bearer KEY`. It is no team key: a team key never opens these endpoints, and the
admin key opens nothing else. Use `admin_guard` as a Litestar guard on any handler that needs it.

A browser cannot add that header to a page it opens, so the status page also takes the key once in a
login form and answers with a session token in a cookie (gateway/ui/auth.py). The token is
`EXPIRY.MAC`, an HMAC of its expiry under the key: every worker and replica with the same key
accepts it without shared state, and changing the key ends every session.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from sdk.errors import AuthenticationError

ENV = "SLIPSTREAM_ADMIN_KEY"


class AdminKey:
    """An optional admin key; `required` is False when none is configured (the endpoints stay open)."""

    def __init__(self, key: str | None):
        self._digest = hashlib.sha256(key.encode()).digest() if key else None

    @classmethod
    def from_env(cls, key: str | None = None) -> AdminKey:
        return cls(key if key is not None else os.environ.get(ENV) or None)

    @property
    def required(self) -> bool:
        return self._digest is not None

    def check(self, authorization: str | None) -> None:
        """Raise AuthenticationError unless `authorization` is `Bearer KEY` with the admin key."""
        if self._digest is None:
            return
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise AuthenticationError("this endpoint needs the admin key: send 'Authorization: Bearer ADMIN_KEY'")
        if not self.accepts(given):
            raise AuthenticationError("invalid admin key")

    def accepts(self, given: str) -> bool:
        """Whether `given` is the admin key (False when none is configured)."""
        if self._digest is None:
            return False
        return hmac.compare_digest(hashlib.sha256(given.strip().encode()).digest(), self._digest)

    def session_token(self, ttl_s: float, now: float | None = None) -> str:
        """A token that `check_session` accepts until `ttl_s` from now; only with a key configured."""
        assert self._digest is not None, "no admin key: no sessions"
        expiry = str(int((time.time() if now is None else now) + ttl_s))
        return f"{expiry}.{self._mac(expiry)}"

    def check_session(self, token: str | None, now: float | None = None) -> bool:
        if self._digest is None or not token:
            return False
        expiry, _, mac = token.partition(".")
        if not expiry.isdigit() or not hmac.compare_digest(mac, self._mac(expiry)):
            return False
        return int(expiry) > (time.time() if now is None else now)

    def _mac(self, expiry: str) -> str:
        assert self._digest is not None
        return hmac.new(self._digest, f"slipstream-ui:{expiry}".encode(), hashlib.sha256).hexdigest()


def admin_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """Litestar guard: the app's `state.admin_key` must accept the request's Authorization header."""
    admin: AdminKey = connection.app.state.admin_key
    admin.check(connection.headers.get("authorization"))
