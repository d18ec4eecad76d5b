"""The object a path's id names, found for the caller's API key only: the lookup every retrieve,
delete and cancel handler shares (another key's object answers as missing, like the providers'
per-project objects)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from .app import Emulator
    from .asgi import Call

T = TypeVar("T")


async def owned(emu: Emulator, call: Call, admit: Callable[[Emulator, Call], Awaitable[str | None]],
                get: Callable[[str, str], T | None], missing: Callable[[str], Awaitable[None]]) -> T | None:
    """`get(id, key)` for the id in the path and the key `admit` (auth and pre-response faults)
    accepted; where it finds nothing, `missing(id)` answers the 404. None once an answer was sent."""
    key = await admit(emu, call)
    if key is None:
        return None
    found = get(call.params[0], key)
    if found is None:
        await missing(call.params[0])
    return found
