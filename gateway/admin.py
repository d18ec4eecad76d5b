"""The admin key: one check for the operator's endpoints (`/metrics` when a key is set, the status page).

The key comes from `slipstream serve --admin-key KEY` or `SLIPSTREAM_ADMIN_KEY` and is sent as
`Authorization: Bearer KEY`. It is no team key: a team key never opens these endpoints, and the
admin key opens nothing else. Use `admin_guard` as a Litestar guard on any handler that needs it.
"""

from __future__ import annotations

import hashlib
import hmac
import os

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
        if not hmac.compare_digest(hashlib.sha256(given.strip().encode()).digest(), self._digest):
            raise AuthenticationError("invalid admin key")


def admin_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """Litestar guard: the app's `state.admin_key` must accept the request's Authorization header."""
    admin: AdminKey = connection.app.state.admin_key
    admin.check(connection.headers.get("authorization"))
