"""Where the state replicas must share lives: in process (the default) or in Redis.

`open_state(url)` picks the backend once, at start: no URL is in-process state (one replica's
truth), `redis://` or `rediss://` is Redis behind a guard that degrades to local state while Redis
is unreachable (sdk/state/guard.py). The interface is sdk/state/backend.py.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any

from sdk.state.backend import StateBackend
from sdk.state.local import LocalState

STATE_URL_ENV = "SLIPSTREAM_STATE_URL"


def open_state(url: str | None = None) -> StateBackend:
    """The backend a state URL names; None reads $SLIPSTREAM_STATE_URL (unset: in process)."""
    url = url if url is not None else os.environ.get(STATE_URL_ENV, "")
    if not url or url == "local":
        return LocalState()
    if url.startswith(("redis://", "rediss://")):
        from sdk.state.guard import GuardedState
        from sdk.state.redis import RedisState

        return GuardedState(RedisState(url))
    raise ValueError(f"state URL {url!r}: expected redis://HOST:PORT/DB or rediss://… (or nothing, for in-process state)")


_background: set[asyncio.Task[Any]] = set()


def in_background(call: Coroutine[Any, Any, Any]) -> None:
    """Run `call` on the running loop without waiting for it (held here so it is not collected)."""
    task = asyncio.get_running_loop().create_task(call)
    _background.add(task)
    task.add_done_callback(_background.discard)


def backend_status(state: StateBackend) -> dict[str, object]:
    """What /readyz shows about the state backend."""
    status = getattr(state, "status", None)
    return status() if status is not None else {"backend": state.kind, "up": True, "mode": "local"}


__all__ = ["STATE_URL_ENV", "StateBackend", "backend_status", "in_background", "open_state"]
