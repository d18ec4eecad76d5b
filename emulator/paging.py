"""Cursor pagination shared by every list endpoint (OpenAI `after`, Anthropic `after_id` /
`before_id`): a page of rows keyed by their "id", plus has_more / first_id / last_id."""

from __future__ import annotations

from typing import Any


def page(rows: list[dict[str, Any]], limit: int, after: str | None = None,
         before: str | None = None) -> dict[str, Any]:
    ids = [r.get("id") for r in rows]
    if before is not None and before in ids:  # the page that ends just before `before`
        rows = rows[: ids.index(before)]
        data = rows[-limit:] if limit else []
    else:
        if after is not None and after in ids:
            rows = rows[ids.index(after) + 1:]
        data = rows[:limit]
    return {"data": data, "has_more": len(rows) > len(data),
            "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}


def limit_of(q: dict[str, str], default: int, most: int) -> int | None:
    """The `limit` query parameter, or None when it is not an integer in 1..most."""
    raw = q.get("limit", str(default))
    return int(raw) if raw.isdigit() and 1 <= int(raw) <= most else None
