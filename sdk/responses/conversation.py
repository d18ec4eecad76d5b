"""A Responses request's conversation, resolved from the team's store before anything is sent.

`previous_response_id` and `item_reference` name objects: they are the team's only if the team's
store holds them (a response is recorded, with its items, when it is answered — sdk/responses/store.py).
An id the team's store does not hold is a 404 answered here, so another team's id and an id nobody
made answer the same, and neither reaches a provider that shares one account between teams (a native
Responses upstream would otherwise continue another team's conversation, or tell its ids apart).

A reasoning item sent by its id alone (`{"type": "reasoning", "id": "rs_…"}` without its
`encrypted_content`), and an image generation call without its `result` (the image it made, which
the next call edits), name objects too: OpenAI reads them from the responses stored on the account
("just include their IDs in subsequent messages to give future responses access to the same reasoning
items", its reasoning-items cookbook; "using image ID", its image generation guide), so on a native
target each is the team's only if the team's store holds it, as an `item_reference` is (a 404
otherwise); and on a translated turn too, whose items the team's store then holds (else another
team's id entered it through such a turn, and went on to the provider from there). One carrying its
encrypted content or its image is self-contained (`store: false`, zero data retention) and passes as sent.
So is an MCP approval (`mcp_approval_response`): the `approval_request_id` it answers is read the same
way, unless the request it answers travels in the same input.

Resolved ids are then served where they can be: a native provider that holds the previous response
itself gets `previous_response_id` as sent; any other target gets the stored conversation in its
place. A referenced item is always sent as the stored item itself (a translated target has no other
way to receive it, and a native one then needs no state of its own to read it).
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sdk.errors import InvalidRequestError, NotFoundError
from sdk.offload import HOLDING
from sdk.responses.store import ResponseStore, StoredResponse, StoreLimits, as_items, history, over_quota

log = logging.getLogger("slipstream.responses")
# The stored responses a pipeline request continues, as the limits stage read them from the team's store to count
# what they send ((team, id) → record; sdk/limits/stage.py sets it around the rest of the pipeline): `resolve` takes
# the record from there instead of asking the store for it again, on every attempt. Only what the team's own store
# answered is in it, so an id the team does not hold is still asked for, and still the 404.
READ: contextvars.ContextVar[dict[tuple[str, str], StoredResponse] | None] = contextvars.ContextVar("slipstream_read", default=None)


@dataclass(slots=True)
class Resolved:
    """What a request continues and the input its target is sent."""

    previous: StoredResponse | None
    own: list[dict[str, Any]]  # the request's own input items, as the client sent them (what is recorded)
    context: list[dict[str, Any]]  # what this target needs in `input`
    expanded: bool  # `previous_response_id` is replaced by `context` (the target does not hold it)
    size: int  # about the bytes of the request with `context` in it: the client's, the history's, the items referenced


class Conversations:
    def __init__(self, team: str, store: Callable[[], ResponseStore]):
        self.team = team
        self.store = store

    async def resolve(self, request_body: dict[str, Any], size: int, holder: str | None, creates: bool = True) -> Resolved:
        """The request's conversation for a target; `holder` is the native provider it goes to (None:
        translated), `creates` whether it makes a response to store (not a count or a compaction).
        Refuses (404) what the team's store does not hold, and (400) a turn to be stored whose own
        conversation would not fit the team's storage quota, or that has too many items to store."""
        previous = await self._previous(request_body)
        own = as_items(request_body.get("input"))
        stored = creates and request_body.get("store") is not False
        if stored:
            limits = self.store().limits.get(self.team, StoreLimits())
            if (why := over_quota(previous, size, limits, len(own))) is not None:
                raise InvalidRequestError(f"{why}; start a new conversation, send store: false, or raise the quota")
        expanded = previous is not None and not _holds(holder, previous)
        # What the target is sent carries the stored history, however small the client's body: its size
        # decides whether serializing and planning it runs in the heavy-work pool (sdk/offload.py:is_large),
        # and the request holds it until it ends, within the process's budget (claimed before it is read).
        if previous is not None and expanded:
            size += previous.chain_bytes
            HOLDING.get()(size)
        # Items read by id (reasoning, a generated image): held, or the 404. On a native target the
        # provider reads them; on any turn answered too, because what a turn sends becomes the team's items (its record, the cache
        # entry a stored turn may then replay), which a later turn's `item_reference`, reasoning by
        # id or expanded history sends natively: an id checked only there passed through a translated
        # turn into the team's store unchecked, and on to the provider from there.
        if (holder is not None or creates) and (by_id := read_by_id(own, stored)):
            await self._references([{"type": "item_reference", "id": item_id} for item_id in dict.fromkeys(by_id)])
        context = [*(await self._history(previous) if previous is not None and expanded else ()), *own]
        context, referenced = await self._references(context, size)
        return Resolved(previous, own, context, expanded, size + referenced)

    async def check_held(self, previous_ids: list[Any], item_ids: list[Any]) -> None:
        """Refuse, as `resolve` does (404; 400 for an id that is not a string), a `previous_response_id`
        or `item_reference` id the team's store does not hold, in requests the provider resolves itself
        (a batch's input lines): on an account teams share it would continue another team's conversation
        or read its items, into an output the team reads."""
        checked: set[str] = set()
        for previous_id in previous_ids:
            if not isinstance(previous_id, str) or previous_id not in checked:
                await self._previous({"previous_response_id": previous_id})  # a 400 for anything but a string
                checked.add(previous_id)
        if item_ids:
            named = dict.fromkeys(i if isinstance(i, str) else None for i in item_ids)  # None: the 400
            await self._references([{"type": "item_reference", "id": item_id} for item_id in named])

    def body(self, request_body: dict[str, Any], resolved: Resolved) -> dict[str, Any]:
        """The body a native target is sent: as it came, unless something had to be expanded."""
        if not resolved.expanded and resolved.context == resolved.own:
            return request_body
        body = {k: v for k, v in request_body.items() if not (resolved.expanded and k == "previous_response_id")}
        body["input"] = resolved.context
        return body

    async def record(self, response: dict[str, Any], request_body: dict[str, Any], resolved: Resolved, provider: str,
                     native: bool) -> None:
        """Store an answered response (unless `store: false`) before the client can name it again."""
        if request_body.get("store") is False or not isinstance(response.get("id"), str):
            return
        previous = resolved.previous.id if resolved.previous is not None else None
        record = StoredResponse(response["id"], self.team, provider, native, time.time(), resolved.own, response, previous)
        try:
            await self.store().put(record)
        except Exception:
            if not native:
                raise  # Slipstream alone would hold it: the answer fails rather than become unreachable
            # The provider answered and holds it; without the record only this team's later use of the id fails.
            log.exception("could not record response %s for team %s", record.id, self.team)

    async def _previous(self, body: dict[str, Any]) -> StoredResponse | None:
        previous_id = body.get("previous_response_id")
        if previous_id is None:
            return None
        if not isinstance(previous_id, str) or not previous_id:
            raise InvalidRequestError("previous_response_id: a response id (string) is required")
        read = READ.get()
        record = read.get((self.team, previous_id)) if read is not None else None
        if record is None:
            record = await self.store().get(self.team, previous_id)
        if record is None:
            raise NotFoundError(f"Previous response with id '{previous_id}' not found.")
        return record

    async def _history(self, previous: StoredResponse) -> list[dict[str, Any]]:
        """The conversation `previous` ends, whose own record is already read: only the turns before it are asked for."""
        earlier = await self.store().chain(self.team, previous.previous) if previous.previous is not None else []
        if previous.previous is not None and (not earlier or earlier[0].previous is not None):
            gone = earlier[0].previous if earlier else previous.previous
            raise NotFoundError(f"Previous response with id '{previous.id}' continues response '{gone}', which is no longer stored.")
        return history([*earlier, previous])

    async def _references(self, items: list[dict[str, Any]], held: int | None = None) -> tuple[list[dict[str, Any]], int]:
        """`items` with each `item_reference` replaced by the item it names, and about how many bytes
        that adds (the stored bytes of the records holding them: a bound). With `held` (the bytes the
        request holds so far) that bound is claimed from the process's body budget before the records
        are read: read first, a request refused by the budget had still read up to its team's quota."""
        named = [item.get("id") for item in items if isinstance(item, dict) and item.get("type") == "item_reference"]
        if not named:
            return items, 0
        ids = [i for i in named if isinstance(i, str) and i]
        if len(ids) < len(named):
            raise InvalidRequestError("item_reference: an item id (string) is required")
        if held is not None:
            HOLDING.get()(held + await self.store().item_bytes(self.team, ids))
        found = await self.store().find_items(self.team, ids)
        missing = next((i for i in ids if i not in found), None)
        if missing is not None:
            raise NotFoundError(f"Item with id '{missing}' not found.")
        holders = {record.id: record.chain_bytes for record, _ in found.values()}
        return [found[item["id"]][1] if isinstance(item, dict) and item.get("type") == "item_reference" else item
                for item in items], sum(holders.values())


# Input items a native provider reads from its own store when sent by id alone: type → the field that
# makes one self-contained. A reasoning item without its `encrypted_content`; an image generation call
# without its `result`, the image (OpenAI's image generation guide, multi-turn editing "using image ID":
# `{"type": "image_generation_call", "id": "ig_…"}` edits the image that call made).
_READ_BY_ID = {"reasoning": "encrypted_content", "image_generation_call": "result", "mcp_approval_request": "arguments"}


def read_by_id(items: Any, stored: bool = False) -> list[str]:
    """The ids of the input items a native provider reads from its own store by id (`_READ_BY_ID`), and
    of the MCP approval requests the input's approvals answer without sending them (`_approved`).

    With `stored` (a turn the team's store will record) the ids of such items sent whole too: the record
    indexes its input items by the ids they came with, so a self-contained item carrying another team's id
    (a reasoning item with any encrypted content) made that id the team's, and a later turn naming it
    by id alone passed the check and had the provider read the other team's item. A turn not recorded
    (`store: false`, the zero-data-retention flow those items are for) still sends them as they are."""
    if not isinstance(items, list):
        return []
    return [item["id"] for item in items if isinstance(item, dict) and isinstance(kind := item.get("type"), str)
            and kind in _READ_BY_ID and isinstance(item.get("id"), str) and (stored or not item.get(_READ_BY_ID[kind]))] \
        + _approved(items, stored)


def _approved(items: list[Any], stored: bool) -> list[str]:
    """An `mcp_approval_response` lets the MCP call its `approval_request_id` names run: OpenAI reads that
    `mcp_approval_request` (server, tool, arguments) from the responses stored on the account (its remote
    MCP guide: the approval is sent with `previous_response_id`, the request left where it is), so another
    team's id approved another team's call. One whose request travels in the same input (a `store: false`
    conversation sends it back) is self-contained, as a reasoning item with its encrypted content is."""
    sent = set() if stored else {item.get("id") for item in items if isinstance(item, dict) and item.get("type") == "mcp_approval_request"}
    return [approval for item in items if isinstance(item, dict) and item.get("type") == "mcp_approval_response"
            and isinstance(approval := item.get("approval_request_id"), str) and approval not in sent]


def _holds(holder: str | None, record: StoredResponse) -> bool:
    """The provider `holder` (native) has the response itself, so it continues it on its own."""
    return holder is not None and record.native and record.provider == holder
