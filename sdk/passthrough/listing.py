"""List pages and objects of the provider's resources as one team may see them (sdk/passthrough/__init__.py
forwards the calls): a list page holds the team's own objects only, read on through further pages
while it holds fewer than the provider's page did, and a created object is recorded as the team's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode

import orjson

from sdk.errors import RateLimitedError
from sdk.passthrough.bodies import rewrite_results_url
from sdk.types import Protocol

if TYPE_CHECKING:
    from sdk.passthrough import _Exchange

MAX_PAGES = 10  # upstream list pages read for one filtered page


async def own_pages(ex: _Exchange, data: dict[str, Any], query: str,
                     page: Callable[[str], Awaitable[dict[str, Any] | None]]) -> dict[str, Any]:
    """A list page with the team's own objects only. While it holds fewer than the provider's page did
    and the provider has more, the next pages are read (at most MAX_PAGES in all), so a team among
    many on one key does not get empty pages (the official clients stop at an empty page). Each page
    after the first is a call on the account every team shares, admitted by the team's limits like a
    request of its own: the page ends with what was found when they refuse one (their 429 when
    nothing was), where one list call read up to MAX_PAGES pages for one request's admission."""
    params = dict(parse_qsl(query))
    cursor = "after" if ex.op.protocol is Protocol.OPENAI else "after_id"
    seen = list_rows(data)
    wanted, rows = len(seen), await ownedlist_rows(ex, seen)
    pages = 1
    while data.get("has_more") is True and seen and len(rows) < wanted and pages < MAX_PAGES and "before_id" not in params:
        try:
            extra = await ex.limits.admit(ex.client.key_id, budget=False)
        except RateLimitedError:
            if rows:
                break
            raise
        try:
            following = await page(urlencode({**params, cursor: seen[-1]["id"]}))
        finally:
            ex.limits.settle(extra, ex.client.key_id, "", None)
        if following is None:
            break
        data, seen, pages = following, list_rows(following), pages + 1
        rows += await ownedlist_rows(ex, seen)
    data["data"] = rows[:wanted]
    data["has_more"] = len(rows) > wanted or data.get("has_more") is True
    for end, at in (("first_id", 0), ("last_id", -1)):
        if end in data:
            data[end] = data["data"][at]["id"] if data["data"] else None
    return data


def list_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = data.get("data")
    return [row for row in rows if isinstance(row, dict) and isinstance(row.get("id"), str)] if isinstance(rows, list) else []


async def ownedlist_rows(ex: _Exchange, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    owned = await ex.owners.owned(ex.team.team, ex.op.kind, [row["id"] for row in rows])
    return [row for row in rows if row["id"] in owned]


async def checked_object(ex: _Exchange, data: dict[str, Any]) -> bytes:
    """An object or a list page (already the team's own rows) as the team may see it: recorded as
    its own when created, its batches' output files noted, `results_url` pointed at the gateway."""
    op, team = ex.op, ex.team.team
    rows = list_rows(data) if op.action == "list" else [data] if isinstance(data.get("id"), str) else []
    if op.action == "create":
        await ex.owners.own(team, op.kind, [row["id"] for row in rows])
    for row in rows if op.kind == "batch" else ():
        outputs = [fid for name in ("output_file_id", "error_file_id") if isinstance(fid := row.get(name), str)]
        await ex.owners.note_outputs(team, row["id"], outputs)
    for row in rows if op.kind == "message_batch" else ():
        rewrite_results_url(row, ex.client.origin)
    return orjson.dumps(data)
