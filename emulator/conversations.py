"""OpenAI Conversations API, the part a Responses turn reads: POST /v1/conversations (with up to 20
initial `items`), GET /v1/conversations/{id} and GET /v1/conversations/{id}/items, and the
`conversation` parameter of POST /v1/responses (an id, or `{"id"}`): the conversation's items are
prepended to the turn's input, and the turn's input and output items are appended to it once the
response completes (OpenAI's API reference: "Items from this conversation are prepended to
`input_items` for this response request. Input items and output items from this response are
automatically added to this conversation after this response completes."). Conversations are scoped
by API key, like OpenAI's per-project objects. Not emulated: update, delete, adding or deleting items."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import openai_wire as wire
from .asgi import Call
from .owned import owned
from .responses_input import input_items

if TYPE_CHECKING:
    from .app import Emulator

MAX_INITIAL_ITEMS = 20


@dataclass(slots=True)
class Conversation:
    key: str  # the API key that created it; other keys get a 404
    obj: dict[str, Any]  # id, object, created_at, metadata
    items: list[dict[str, Any]] = field(default_factory=list)


class ConversationStore:
    """Bounded map id -> Conversation (oldest dropped first)."""

    def __init__(self, max_entries: int = 10_000) -> None:
        self.entries: OrderedDict[str, Conversation] = OrderedDict()
        self.max_entries = max_entries

    def put(self, entry: Conversation) -> None:
        self.entries[entry.obj["id"]] = entry
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)

    def get(self, cid: str, key: str) -> Conversation | None:
        e = self.entries.get(cid)
        return e if e is not None and e.key == key else None

    def clear(self) -> None:
        self.entries.clear()


def named(body: dict[str, Any]) -> str | None:
    """The id a Responses body's `conversation` names (a string, or `{"id"}`), or None."""
    value = body.get("conversation")
    value = value.get("id") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None


def missing(cid: str) -> str:
    return f"Conversation with id '{cid}' not found."


async def create(emu: Emulator, call: Call) -> None:
    pre = await wire.preamble(emu, call)
    if pre is None:
        return
    body, key = pre
    raw = body.get("items")
    if raw is not None and not isinstance(raw, list):
        await wire.bad(emu, call, "Invalid type for 'items': expected an array of input items.", "items", "invalid_type")
        return
    if raw is not None and len(raw) > MAX_INITIAL_ITEMS:
        await wire.bad(emu, call, f"Invalid 'items': array too long. Expected an array with maximum length "
                       f"{MAX_INITIAL_ITEMS}, but got an array with length {len(raw)} instead.", "items", "array_above_max_length")
        return
    obj = {"id": emu.new_id("conv_"), "object": "conversation", "created_at": int(time.time()),
           "metadata": body.get("metadata") or {}}
    emu.state.conversations.put(Conversation(key, obj, input_items(raw, emu.new_id)))
    await wire.ok(emu, call, obj)


async def _held(emu: Emulator, call: Call) -> Conversation | None:
    async def absent(cid: str) -> None:
        await wire.not_found(emu, call, missing(cid))

    return await owned(emu, call, wire.admit, emu.state.conversations.get, absent)


async def retrieve(emu: Emulator, call: Call) -> None:
    conversation = await _held(emu, call)
    if conversation is not None:
        await wire.ok(emu, call, conversation.obj)


async def items(emu: Emulator, call: Call) -> None:
    """The conversation's items, newest first unless `order=asc`; `limit` 1-100, `after` an id."""
    conversation = await _held(emu, call)
    if conversation is None:
        return
    asc = call.query().get("order", "desc") == "asc"
    await wire.answer_page(emu, call, conversation.items if asc else conversation.items[::-1])
