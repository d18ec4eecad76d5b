"""The live status page (`GET /ui`, docs/observability.md): server-rendered HTML behind the admin key,
charts drawn by the vendored uPlot from `GET /ui/data`, fed by sdk/observability/live_stats.py.

auth.py    who may see it (Bearer admin key, or the session cookie from the login form)
data.py    what it shows, gathered from the live buckets, the routers' breakers and the spend records
page.py    the HTML
routes.py  the Litestar handlers
static/    uPlot (MIT, see uPlot.LICENSE), the page's script and style
"""

from gateway.ui.routes import UI_HANDLERS

__all__ = ["UI_HANDLERS"]
