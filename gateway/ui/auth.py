"""Who may see the status page: the admin key as `Authorization: Bearer KEY`, or a session cookie.

A browser cannot add a header to a page it opens, so the page offers a login form: the key is
POSTed once to `/ui/login` (never in a URL, where history, logs and Referer headers would keep it)
and the answer sets `slipstream_ui`, an HttpOnly, SameSite=Strict cookie scoped to `/ui` holding a
session token derived from the key (gateway/admin.py:AdminKey.session_token), valid for 12 hours.
Without a configured admin key the page is closed: it names teams and their traffic.

Logout revokes the token on the server, not only in the browser: a record named after the token's
digest, kept until the token's expiry where the state backend keeps records every process agrees on
(sdk/state/ownership.py:records_of): without Redis the host's SQLite file under the data directory,
so every worker of `--workers N --local-state` and a restarted proxy refuse it (a flag in process
memory was seen by the worker that took the logout alone, and forgotten by a restart); over Redis a
key, so every replica does. A copied cookie stops working.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from litestar.connection import ASGIConnection
from litestar.datastructures import Cookie, State
from litestar.handlers.base import BaseRouteHandler

from gateway.admin import AdminKey
from gateway.refusals import client_address
from sdk.errors import AuthenticationError, SlipstreamError
from sdk.state.backend import StateBackend
from sdk.state.ownership import Records, records_of

COOKIE = "slipstream_ui"
SESSION_TTL_S = 12 * 3600
LOGIN_FORM_MAX_BYTES = 4096  # the form holds one key: a bigger body is refused (413) before it is read
NO_ADMIN_KEY = ("the status page needs an admin key: start the proxy with SLIPSTREAM_ADMIN_KEY set "
                "or --admin-key-file PATH")


class NoAdminKey(SlipstreamError):
    status = 403


async def authorize(connection: ASGIConnection[Any, Any, Any, State]) -> None:
    """Raise NoAdminKey (none configured) or AuthenticationError unless the caller holds the key or a session."""
    admin: AdminKey = connection.app.state.admin_key
    if not admin.required:
        raise NoAdminKey(NO_ADMIN_KEY)
    authorization = connection.headers.get("authorization")
    if authorization is not None:  # a header, when sent, must be right: no falling back to the cookie
        admin.check(authorization, client_address(connection.scope), connection.scope["path"])
    elif not await _live_session(admin, _records(connection), connection.cookies.get(COOKIE)):
        raise AuthenticationError("the status page needs the admin key: sign in at /ui, or send 'Authorization: Bearer ADMIN_KEY'")


def _records(connection: ASGIConnection[Any, Any, Any, State]) -> Records:
    state: StateBackend = connection.app.state.registry.services.state()
    return records_of(state)


def _revocation(token: str) -> str:
    return "ui-logout:" + hashlib.sha256(token.encode()).hexdigest()[:32]


async def _live_session(admin: AdminKey, records: Records, token: str | None) -> bool:
    if token is None or not admin.check_session(token):
        return False
    return (await records.get([_revocation(token)]))[0] is None


async def revoke_session(connection: ASGIConnection[Any, Any, Any, State]) -> None:
    """End the caller's session for every worker and replica (a no-op without a valid one: only the
    holder of a session can write its record, so the records cannot be flooded)."""
    admin: AdminKey = connection.app.state.admin_key
    token = connection.cookies.get(COOKIE)
    if token is not None and admin.check_session(token):
        # kept until the token expires (at least a second: a Redis expiry is whole seconds)
        keep_s = max(1.0, float(token.partition(".")[0]) - time.time())
        await _records(connection).put({_revocation(token): "revoked"}, keep_s)


async def ui_guard(connection: ASGIConnection[Any, Any, Any, State], _: BaseRouteHandler) -> None:
    """Litestar guard for the page's data and assets."""
    await authorize(connection)


def session_cookie(admin: AdminKey, secure: bool) -> Cookie:
    return Cookie(key=COOKIE, value=admin.session_token(SESSION_TTL_S), path="/ui", max_age=SESSION_TTL_S,
                  httponly=True, samesite="strict", secure=secure)


def cleared_cookie(secure: bool) -> Cookie:
    return Cookie(key=COOKIE, value="", path="/ui", max_age=0, httponly=True, samesite="strict", secure=secure)
