"""The status page's door: `GET /ui` (the page), `GET /ui/data` (what it refreshes from),
`POST /ui/login` and `/ui/logout` (the session cookie, gateway/ui/auth.py), `GET /ui/static/NAME`
(uPlot and the page's own script and style, vendored in gateway/ui/static/: no CDN, works offline)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

from litestar import Request, Response, get, post
from litestar.datastructures import State
from litestar.params import PathParameter
from litestar.response import Redirect

from gateway.admin import AdminKey
from gateway.refusals import client_address
from gateway.ui import page
from gateway.ui.auth import (
    LOGIN_FORM_MAX_BYTES,
    NO_ADMIN_KEY,
    NoAdminKey,
    authorize,
    cleared_cookie,
    revoke_session,
    session_cookie,
    ui_guard,
)
from gateway.ui.data import Status, gather
from sdk.errors import AuthenticationError, NotFoundError, RateLimitedError
from sdk.runtime import TeamRegistry

STATIC = Path(__file__).with_name("static")
_MEDIA = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
# Read once at import: a handful of small files, so serving them never touches the disk.
ASSETS = {path.name: (path.read_bytes(), _MEDIA[path.suffix]) for path in STATIC.iterdir() if path.suffix in _MEDIA}
PAGE_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "cache-control": "no-store",
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
}


def _html(body: str, status_code: int = 200, headers: dict[str, str] | None = None) -> Response[str]:
    return Response(body, status_code=status_code, media_type="text/html; charset=utf-8", headers={**PAGE_HEADERS, **(headers or {})})


def status_json(status: Status) -> dict[str, Any]:
    return {
        "generated_at": status.generated_at,
        "pid": status.pid,
        "workers": status.workers,
        "bucket_s": status.bucket_s,
        "window_s": status.window_s,
        "times": status.times,
        "teams": [
            {"team": team.team, "summary_html": page.team_summary(team), "charts": [asdict(chart) for chart in team.charts]}
            for team in status.teams
        ],
    }


async def _status(request: Request[Any, Any, State]) -> Status:
    registry: TeamRegistry = request.app.state.registry
    return await gather(registry, registry.services.state())


@get("/ui")
async def ui_page(request: Request[Any, Any, State]) -> Response[str]:
    try:
        await authorize(request)
    except NoAdminKey:
        return _html(page.closed_page(NO_ADMIN_KEY), 403)
    except AuthenticationError:
        return _html(page.login_page("Sign in with the proxy's admin key."), 401)
    return _html(page.status_page(await _status(request)))


@get("/ui/data", guards=[ui_guard])
async def ui_data(request: Request[Any, Any, State]) -> Response[dict[str, Any]]:
    return Response(status_json(await _status(request)), headers={"cache-control": "no-store"})


@get("/ui/static/{name:str}", guards=[ui_guard], sync_to_thread=False)
def ui_static(name: Annotated[str, PathParameter()]) -> Response[bytes]:
    found = ASSETS.get(name)
    if found is None:
        raise NotFoundError(f"/ui/static/{name} is not one of the page's files")
    return Response(found[0], media_type=found[1], headers={"cache-control": "private, max-age=3600"})


@post("/ui/login", status_code=303, request_max_body_size=LOGIN_FORM_MAX_BYTES)
async def ui_login(request: Request[Any, Any, State]) -> Response[str]:
    admin: AdminKey = request.app.state.admin_key
    if not admin.required:
        return _html(page.closed_page(NO_ADMIN_KEY), 403)
    source, path = client_address(request.scope), request.scope["path"]
    try:
        admin.refuse_if_throttled(source, path)  # before the body is read
        given = (await request.form()).get("key")
        admin.verify(given if isinstance(given, str) else "", source, path)
    except AuthenticationError:
        return _html(page.login_page("That is not the admin key."), 401)
    except RateLimitedError as exc:
        return _html(page.login_page(exc.message), 429, exc.headers)
    return Redirect("/ui", status_code=303, cookies=[session_cookie(admin, request.url.scheme == "https")])


@post("/ui/logout", status_code=303, request_max_body_size=LOGIN_FORM_MAX_BYTES)
async def ui_logout(request: Request[Any, Any, State]) -> Response[str]:
    await revoke_session(request)
    return Redirect("/ui", status_code=303, cookies=[cleared_cookie(request.url.scheme == "https")])


# The app reads the registry and the admin key from its state (gateway/app.py).
UI_HANDLERS = [ui_page, ui_data, ui_static, ui_login, ui_logout]
