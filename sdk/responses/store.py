"""The response store: what a later `previous_response_id`, `item_reference`, GET, DELETE or
input_items needs.

Every stored response is kept per team: each method takes the team, every key includes it, so an
id from another team reads as unknown, exactly like an id nobody made. The embedded default is
SQLite under the data dir (beside the response cache; sdk/responses/sqlite_store.py); a shared
store (Redis, for several workers; redis_store.py) implements the same `ResponseStore` protocol.

A record keeps only what its own request added: its input items as the client sent them (item
references stay references) and the response object the client got, with a pointer to the response
it continued (`previous`). A conversation is the chain of records, walked on read (one recursive
query, or one Lua call), never copied into each turn: 15 turns of 1 MiB store ~15 MiB, not the
135 MiB a copy per turn would. `native` records the provider that holds the response itself (a
native Responses upstream), where GET, DELETE and input_items are forwarded; the record is also
the team's proof of ownership, checked before anything names that id upstream.

Bounded per team (`StoreLimits`, the policy's `responses_store`): a retention counted from the
conversation's last turn (writing a turn renews its whole chain, so a live conversation never
loses its beginning), and a quota in bytes and responses. Over the quota the least recently used
responses of the team go first (leaves before the turns they continue, so what remains is still a
whole conversation); the chain being written is never evicted: a turn whose own conversation would
not fit, or with more than MAX_TURN_ITEMS input items, is refused before it is sent (`over_quota`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

RETENTION_S = 30 * 86400  # OpenAI keeps stored responses for 30 days
# Input items one stored turn may hold: each is a key the store writes, in Redis in one script that
# holds the server every replica and team shares (300,000 one-word messages held it for 6 s).
MAX_TURN_ITEMS = 10_000
MAX_CHAIN = 1_000_000  # a walk never goes further (a guard, not a limit anyone reaches)


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """A team's share of the response store (policy `responses_store`, policies/README.md)."""

    max_entries: int = 100_000
    max_bytes: int = 1024 * 1024 * 1024
    ttl_s: float = RETENTION_S


@dataclass(slots=True)
class StoredResponse:
    id: str
    team: str
    provider: str  # the policy's provider name that answered
    native: bool  # that provider stores the response too (it served the Responses API natively)
    created_at: float
    input: list[dict[str, Any]]  # this request's own input items, as sent
    response: dict[str, Any]  # the response object as the client received it
    previous: str | None = None  # the response this one continued
    depth: int = 1  # responses in its chain, itself included (set by the store)
    chain_bytes: int = 0  # stored bytes of its chain, itself included (set by the store)

    def listed_input(self) -> list[dict[str, Any]]:
        """Its input items, each with an id (the client's, or one derived from the response id)."""
        return [item if isinstance(item.get("id"), str) else {**item, "id": derived_id(self.id, i, item)}
                for i, item in enumerate(self.input)]

    def items(self) -> Iterable[tuple[str, dict[str, Any]]]:
        """(id, item) for every item a later request may reference: its input items, then its output."""
        for item in self.listed_input():
            if item.get("type") != "item_reference":  # a reference's id names another item
                yield item["id"], item
        for item in self.response.get("output") or ():
            if isinstance(item, dict) and isinstance(item.get("id"), str):
                yield item["id"], item


def derived_id(response_id: str, index: int, item: Mapping[str, Any]) -> str:
    """A stable id for an input item the client sent without one (listed by input_items, referable)."""
    kind = item.get("type", "message")
    prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}.get(kind, "item")
    return f"{prefix}_{hashlib.sha256(f'{response_id}/{index}'.encode()).hexdigest()[:48]}"


def history(chain: list[StoredResponse]) -> list[dict[str, Any]]:
    """The input items a next turn continues from: each turn's input, then its output, oldest first."""
    return [item for record in chain for item in (*record.input, *(record.response.get("output") or ()))]


def as_items(value: Any) -> list[dict[str, Any]]:
    """A request's `input` as items (a string is one user message)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return list(value or [])


def over_quota(previous: StoredResponse | None, request_bytes: int, limits: StoreLimits, items: int = 0) -> str | None:
    """Why a turn cannot be stored whole (its conversation alone exceeds the team's quota, or it has
    more than MAX_TURN_ITEMS input items of its own), or None."""
    if items > MAX_TURN_ITEMS:
        return (f"this turn has {items} input items; a turn to be stored may hold at most {MAX_TURN_ITEMS} items of its own "
                "(continue with previous_response_id to send only the new ones)")
    depth = (previous.depth if previous else 0) + 1
    size = (previous.chain_bytes if previous else 0) + request_bytes
    if depth > limits.max_entries:
        return f"this conversation would hold {depth} responses, over the team's quota of {limits.max_entries} (policy responses_store.max_entries)"
    if size > limits.max_bytes:
        return f"this conversation would store about {size} bytes, over the team's quota of {limits.max_bytes} (policy responses_store.max_bytes)"
    return None


class ResponseStore(Protocol):
    """A record is readable by `get` and `chain` as soon as `put` has been called, before the write
    completes. `limits` maps a team to its share; a team it does not name gets `StoreLimits()`."""

    limits: Mapping[str, StoreLimits]

    async def put(self, record: StoredResponse) -> None: ...
    async def get(self, team: str, response_id: str) -> StoredResponse | None: ...
    async def chain(self, team: str, response_id: str) -> list[StoredResponse]:
        """The conversation ending at `response_id`, oldest first: empty when the id is unknown; when
        the first record still names a `previous`, that one is gone (deleted or expired)."""
        ...
    async def find_items(self, team: str, item_ids: list[str]) -> dict[str, tuple[StoredResponse, dict[str, Any]]]:
        """item id → (the team's record holding it, the item), for the ids the team's records hold."""
        ...
    async def delete(self, team: str, response_id: str) -> bool: ...
    async def chain_bytes(self, team: str, response_id: str) -> int:
        """Stored bytes of the conversation ending at `response_id` (0 when the id is unknown): what a
        continuation sends the provider besides its own turn, read without reading the records."""
        ...
    async def item_bytes(self, team: str, item_ids: list[str]) -> int:
        """Stored bytes of the team's records holding these items, each record once: a bound on what
        `find_items` reads, known without reading the records (so it can be held first)."""
        ...


def pick_items(records: Mapping[str, StoredResponse], owners: Mapping[str, str]) -> dict[str, tuple[StoredResponse, dict[str, Any]]]:
    """`find_items`' answer from item id → owning response id and the records read."""
    found: dict[str, tuple[StoredResponse, dict[str, Any]]] = {}
    for item_id, owner in owners.items():
        record = records.get(owner)
        item = dict(record.items()).get(item_id) if record is not None else None
        if record is not None and item is not None:
            found[item_id] = (record, item)
    return found


