"""Who may see the status page: the admin key as `Authorization: Bearer KEY`, or a session cookie.

A browser cannot add a header to a page it opens, so the page offers a login form: the key is
POSTed once to `/ui/login` (never in a URL, where history, logs and Referer headers would keep it)
and the answer sets `slipstream_ui`, an HttpOnly, SameSite=Strict cookie scoped to `/ui` holding a
session token derived from the key (gateway/admin.py:AdminKey.session_token), valid for 12 hours.
Without a configured admin key the page is closed: it names teams and their traffic.
"""

from __future__ import annotations

from litestar.connection import ASGIConnection
from litestar.datastructures import Cookie
from litestar.handlers.base import BaseRouteHandler

from gateway.admin import AdminKey
from sdk.errors import AuthenticationError, SlipstreamError

COOKIE = "slipstream_ui"
SESSION_TTL_S = 12 * 3600
NO_ADMIN_KEY = "the status page needs an admin key: start the proxy with --admin-key KEY or set SLIPSTREAM_ADMIN_KEY"


class NoAdminKey(SlipstreamError):
    status = 403


def authorize(connection: ASGIConnection) -> None:
    """Raise NoAdminKey (none configured) or AuthenticationError unless the caller holds the key or a session."""
    admin: AdminKey = connection.app.state.admin_key
    if not admin.required:
        raise NoAdminKey(NO_ADMIN_KEY)
    authorization = connection.headers.get("authorization")
    if authorization is not None:  # a header, when sent, must be right: no falling back to the cookie
        admin.check(authorization)
    elif not admin.check_session(connection.cookies.get(COOKIE)):
        raise AuthenticationError("the status page needs the admin key: sign in at /ui, or send 'Authorization: Bearer ADMIN_KEY'")


def ui_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """Litestar guard for the page's data and assets."""
    authorize(connection)


def session_cookie(admin: AdminKey, secure: bool) -> Cookie:
    return Cookie(key=COOKIE, value=admin.session_token(SESSION_TTL_S), path="/ui", max_age=SESSION_TTL_S,
                  httponly=True, samesite="strict", secure=secure)


def cleared_cookie(secure: bool) -> Cookie:
    return Cookie(key=COOKIE, value="", path="/ui", max_age=0, httponly=True, samesite="strict", secure=secure)
