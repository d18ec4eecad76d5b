"""The status page's HTML, rendered here; the browser only draws charts and swaps in fresh fragments.

Every value that comes from a policy or from traffic (team names, routes, miss causes) is escaped.
No inline script or style: the page is served with a Content-Security-Policy of 'self' only.
"""

from __future__ import annotations

import time
from html import escape

from gateway.ui.data import Status, TeamStatus
from sdk.observability.live_stats import RouteWindow

REFRESH_S = 5


def _head(title: str) -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<link rel="stylesheet" href="/ui/static/uPlot.min.css"><link rel="stylesheet" href="/ui/static/ui.css"></head>')


def login_page(message: str) -> str:
    return (_head("Slipstream status: sign in") + '<body class="login"><main><h1>Slipstream status</h1>'
            f'<p class="note">{escape(message)}</p>'
            '<form method="post" action="/ui/login"><label>Admin key <input type="password" name="key" '
            'autocomplete="current-password" required autofocus></label> <button type="submit">Sign in</button></form>'
            '<p class="note">The key is sent once; the page then keeps a session cookie for 12 hours.</p>'
            '</main></body></html>')


def closed_page(message: str) -> str:
    return _head("Slipstream status") + f'<body class="login"><main><h1>Slipstream status</h1><p>{escape(message)}.</p></main></body></html>'


def status_page(status: Status) -> str:
    span = f"{status.window_s // 60} minutes" if status.window_s >= 120 else f"{status.window_s} seconds"
    sections = "".join(
        f'<section class="team" data-team="{escape(team.team)}"><h2>{escape(team.team)}</h2>'
        f'<div class="summary">{team_summary(team)}</div><div class="charts"></div></section>'
        for team in status.teams
    )
    return (_head("Slipstream status") + '<body><header><h1>Slipstream status</h1>'
            f'<p class="note">The last {span} in {status.bucket_s}-second buckets, refreshed every '
            f'{REFRESH_S} s. Updated <span id="updated">{_clock(status.generated_at)}</span>. '
            f'{_processes(status)}</p>'
            '<form method="post" action="/ui/logout"><button type="submit">Sign out</button></form></header>'
            f'<main id="teams" data-refresh-ms="{REFRESH_S * 1000}">{sections or _nothing()}</main>'
            '<script src="/ui/static/uPlot.iife.min.js"></script><script src="/ui/static/ui.js"></script></body></html>')


def _processes(status: Status) -> str:
    if status.workers > 1:
        return (f'The numbers of this host\'s {status.workers} worker processes (process {status.pid} answered; the '
                'others\' as of a few seconds ago). Replicas on other hosts keep their own.')
    return (f'This is process {status.pid}: replicas behind a load balancer keep their own numbers, so a refresh '
            'shows whichever answered.')


def _nothing() -> str:
    return '<p class="note">No team is served and no request has been seen.</p>'


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "–"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def team_summary(team: TeamStatus) -> str:
    """The team's cards and route table: one fragment, sent again with each refresh."""
    totals = team.totals
    requests = totals["requests"]
    cards = [
        _card("Traffic", f"<b>{requests:,}</b> requests · <b>{totals['errors']:,}</b> errors "
                         f"({_pct(totals['errors'], requests)}) · {totals['cancelled']:,} cancelled"
                         + ("" if team.served else '<br><span class="warn">no longer in the policies</span>')),
        _card("Prompt cache", _prompt_cache(team)),
        _card("Response cache", _response_cache(team)),
        _card("Compression", _compression(team)),
        _card("Breakers", _breakers(team)),
        _card("Spend", _spend(team)),
    ]
    table = _routes(team.routes) if team.routes else '<p class="note">No requests in the window.</p>'
    return f'<div class="cards">{"".join(cards)}</div>{table}'


def _card(title: str, body: str) -> str:
    return f'<div class="card" data-card="{escape(title.lower())}"><h3>{escape(title)}</h3><div>{body}</div></div>'


def _prompt_cache(team: TeamStatus) -> str:
    totals = team.totals
    tokens = totals["input_tokens"]
    if not tokens:
        return '<span class="note">no answered request in the window</span>'
    body = (f"read <b>{_pct(totals['cache_read_tokens'], tokens)}</b> of {tokens:,} input tokens, "
            f"expected {_pct(totals['expected_read_tokens'], tokens)}")
    if team.top_causes:
        causes = "".join(f"<li><code>{escape(cause)}</code> ×{count}</li>" for cause, count in team.top_causes)
        body += f'<ol class="causes">{causes}</ol>'
    return body


def _response_cache(team: TeamStatus) -> str:
    if not team.response_cache:
        return '<span class="note">off in this policy</span>'
    totals = team.totals
    hits = totals["exact_hits"] + totals["semantic_hits"]
    return (f"<b>{_pct(hits, totals['requests'])}</b> of requests answered from it "
            f"({totals['exact_hits']:,} exact, {totals['semantic_hits']:,} semantic)")


def _compression(team: TeamStatus) -> str:
    if not team.compression:
        return '<span class="note">off in this policy</span>'
    before, after = team.totals["compression_before"], team.totals["compression_after"]
    if not before:
        return '<span class="note">nothing compressed in the window</span>'
    return f"<b>{before - after:,}</b> tokens saved ({_pct(before - after, before)}): {before:,} → {after:,}"


def _breakers(team: TeamStatus) -> str:
    if not team.breakers_enabled:
        return '<span class="note">off in this policy</span>'
    if not team.breakers:
        return '<span class="note">no target tried yet</span>'
    rows = "".join(f'<tr><td><code>{escape(target)}</code></td><td class="breaker-{escape(state)}">{escape(state.replace("_", "-"))}</td></tr>'
                   for target, state in team.breakers.items())
    return f'<table class="breakers">{rows}</table>'


def _spend(team: TeamStatus) -> str:
    spend = team.spend
    if spend is None:
        return '<span class="note">–</span>'
    day, month = spend["day"], spend["month"]
    body = f"${day['total']:,.4f} today · ${month['total']:,.4f} this month"  # type: ignore[index]
    budget = spend.get("budget")
    if isinstance(budget, dict):
        spent, usd = budget["spent"], budget["usd"]
        state = ' class="over"' if spent >= usd else ""
        body += (f'<br><b{state}>${spent:,.4f}</b> of the ${usd:,.2f} {escape(str(budget["period"]))} budget '
                 f'({_pct(spent, usd)})<br><meter min="0" max="{usd}" high="{0.8 * usd}" value="{min(spent, usd)}"></meter>')
    else:
        body += '<br><span class="note">no budget set</span>'
    return body


def _routes(routes: list[RouteWindow]) -> str:
    head = ("<tr><th>route</th><th>requests</th><th>errors</th><th>TTFT p50 / p95 / p99 (ms)</th>"
            "<th>end-to-end p50 / p95 / p99 (ms)</th></tr>")
    rows = "".join(
        f"<tr><td><code>{escape(r.route)}</code></td><td>{r.totals['requests']:,}</td><td>{r.totals['errors']:,}</td>"
        f"<td>{' / '.join(_ms(v) for v in r.ttft_total_ms.values())}</td>"
        f"<td>{' / '.join(_ms(v) for v in r.e2e_total_ms.values())}</td></tr>"
        for r in routes
    )
    return f'<table class="routes">{head}{rows}</table>'
