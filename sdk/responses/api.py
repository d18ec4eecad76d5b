"""GET /v1/responses/{id}, DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items for one team.

Both doors call these. An id is looked up in the team's response store only, so another team's id,
or one Slipstream never saw, is a 404 (the same answer for both: no oracle), and nothing is sent
upstream for it. A response a native provider served lives at that provider too: the call is
forwarded there only once the team's record proves the id is the team's (the provider's copy is the
authority, and a DELETE must reach it), with the store's record deleted alongside; a translated one
is answered from the store.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qs, quote

import orjson

from sdk.errors import InvalidRequestError, NotFoundError
from sdk.offload import off_loop_if_large
from sdk.providers.base import HTTPProvider, Provider
from sdk.responses.store import ResponseStore, StoredResponse
from sdk.types import LLMResponse, Timings, Usage

_DEFAULT_LIMIT, _MAX_LIMIT = 20, 100


class StoredResponses:
    def __init__(self, team: str, store: Callable[[], ResponseStore], providers: Mapping[str, Provider]):
        self.team = team
        self.store = store
        self.providers = providers

    async def _record(self, response_id: str) -> StoredResponse:
        record = await self.store().get(self.team, response_id)
        if record is None:
            raise NotFoundError(f"Response with id '{response_id}' not found.")
        return record

    def _holder(self, record: StoredResponse) -> HTTPProvider | None:
        provider = self.providers.get(record.provider)
        return provider if record.native and isinstance(provider, HTTPProvider) else None

    async def retrieve(self, response_id: str, query: str = "") -> LLMResponse:
        record = await self._record(response_id)
        if parse_qs(query).get("stream") == ["true"]:
            raise InvalidRequestError("stream=true replays background responses, which Slipstream does not run")
        holder = self._holder(record)
        if holder is not None:
            return await holder.call("GET", f"/responses/{quote(response_id)}" + (f"?{query}" if query else ""), Timings())
        # A large record (a response echoing long instructions) is written in the heavy-work pool, as the
        # team's work, not on the loop every team's requests share; the chain's bytes bound the record's.
        return await off_loop_if_large(record.chain_bytes, _json, record.response, record.provider)

    async def delete(self, response_id: str) -> LLMResponse:
        record = await self._record(response_id)
        holder = self._holder(record)
        answer = await holder.call("DELETE", f"/responses/{quote(response_id)}", Timings()) if holder is not None else None
        await self.store().delete(self.team, response_id)
        return answer or _json({"id": response_id, "object": "response.deleted", "deleted": True}, record.provider)

    async def input_items(self, response_id: str, query: str = "") -> LLMResponse:
        record = await self._record(response_id)
        holder = self._holder(record)
        if holder is not None:
            path = f"/responses/{quote(response_id)}/input_items" + (f"?{query}" if query else "")
            return await holder.call("GET", path, Timings())
        return await off_loop_if_large(record.chain_bytes, _listed, record, query)


def _listed(record: StoredResponse, query: str) -> LLMResponse:
    """A page of the record's input items, written."""
    return _json(_page([_as_item(item) for item in record.listed_input()], parse_qs(query)), record.provider)


def _json(data: dict[str, Any], provider: str) -> LLMResponse:
    return LLMResponse(status=200, body=orjson.dumps(data), headers={}, usage=Usage(), route=f"{provider}/store")


def _as_item(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as the API lists it (its id is the store's: StoredResponse.listed_input), a
    message's text as typed content parts."""
    item = dict(item)
    if item.setdefault("type", "message") == "message":
        part = "output_text" if item.get("role") == "assistant" else "input_text"
        if isinstance(item.get("content"), str):
            item["content"] = [{"type": part, "text": item["content"]}]
        item.setdefault("status", "completed")
    return item


def _page(items: list[dict[str, Any]], query: dict[str, list[str]]) -> dict[str, Any]:
    order = (query.get("order") or ["desc"])[0]
    if order not in ("asc", "desc"):
        raise InvalidRequestError("order: 'asc' or 'desc'")
    try:
        limit = int((query.get("limit") or [str(_DEFAULT_LIMIT)])[0])
    except ValueError:
        raise InvalidRequestError("limit: an integer between 1 and 100") from None
    if not 1 <= limit <= _MAX_LIMIT:
        raise InvalidRequestError("limit: an integer between 1 and 100")
    ordered = items[::-1] if order == "desc" else items
    after = next(iter(query.get("after") or ()), None)
    if after is not None:
        ids = [item["id"] for item in ordered]
        ordered = ordered[ids.index(after) + 1 :] if after in ids else []
    page = ordered[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(ordered) > limit}
