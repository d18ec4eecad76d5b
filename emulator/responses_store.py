"""Stored responses (`store: true`, the default) and the endpoints that read them:
GET / DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items, and the context that
`previous_response_id` prepends. Entries are scoped by API key, like OpenAI's per-project store."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import openai_wire as wire
from .asgi import Call
from .owned import owned

if TYPE_CHECKING:
    from .app import Emulator


@dataclass(slots=True)
class StoredResponse:
    key: str  # the API key that created it; other keys get a 404
    response: dict[str, Any]
    input_items: list[dict[str, Any]]  # this request's input, as items with ids
    context: list[dict[str, Any]]  # every item the model saw: earlier turns, then input_items


class ResponseStore:
    """Bounded map id -> StoredResponse (oldest dropped first)."""

    def __init__(self, max_entries: int = 10_000) -> None:
        self.entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.max_entries = max_entries

    def put(self, rid: str, entry: StoredResponse) -> None:
        self.entries[rid] = entry
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)

    def get(self, rid: str, key: str) -> StoredResponse | None:
        e = self.entries.get(rid)
        return e if e is not None and e.key == key else None

    def delete(self, rid: str, key: str) -> bool:
        if self.get(rid, key) is None:
            return False
        del self.entries[rid]
        return True

    def holds_item(self, item_id: str, key: str) -> bool:
        """Whether a response `key` stored has an output item `item_id` (what an input item sent by id reads)."""
        return any(e.key == key and any(item.get("id") == item_id for item in e.response.get("output") or ())
                   for e in self.entries.values())

    def continuation(self, rid: str, key: str) -> list[dict[str, Any]] | None:
        """What `previous_response_id=rid` prepends: that turn's context, then its output."""
        e = self.get(rid, key)
        return None if e is None else e.context + e.response["output"]

    def clear(self) -> None:
        self.entries.clear()


async def _stored(emu: Emulator, call: Call) -> StoredResponse | None:
    """The response the path names, after auth and faults; None once answered."""

    async def absent(rid: str) -> None:
        await wire.not_found(emu, call, f"Response with id '{rid}' not found.")

    return await owned(emu, call, wire.admit, emu.state.responses.get, absent)


async def retrieve(emu: Emulator, call: Call) -> None:
    e = await _stored(emu, call)
    if e is not None:
        await wire.ok(emu, call, e.response)


async def delete(emu: Emulator, call: Call) -> None:
    e = await _stored(emu, call)
    if e is not None:
        rid = call.params[0]
        emu.state.responses.delete(rid, e.key)
        await wire.ok(emu, call, {"id": rid, "object": "response.deleted", "deleted": True})


async def cancel(emu: Emulator, call: Call) -> None:
    if await _stored(emu, call) is not None:
        await wire.bad(emu, call, "Only responses created with background=true can be cancelled.")


async def input_items(emu: Emulator, call: Call) -> None:
    """The request's input items, newest first unless `order=asc`; `limit` 1-100, `after` an id."""
    e = await _stored(emu, call)
    if e is None:
        return
    q = call.query()
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        await wire.bad(emu, call, f"Invalid value: '{order}'. Supported values are: 'asc' and 'desc'.",
                       "order", "invalid_value")
        return
    await wire.answer_page(emu, call, e.input_items if order == "asc" else e.input_items[::-1])
