"""Where the state replicas must share lives: in process (the default) or in Redis.

`open_state(url)` picks the backend once, at start: no URL is in-process state (one replica's
truth), `redis://`, `redis+sentinel://`, `redis+cluster://` (or `rediss…`, TLS: sdk/state/redis_url.py) is Redis behind a guard that degrades to local state while Redis
is unreachable (sdk/state/guard.py). The interface is sdk/state/backend.py.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from sdk.state.backend import StateBackend
from sdk.state.local import LocalState
from sdk.state.spend_file import SpendFile, spend_file_from_env

STATE_URL_ENV = "SLIPSTREAM_STATE_URL"
_SECRET_PARAMS = ("pass", "secret", "token", "key")  # query options whose values are credentials (ssl_keyfile: a path, masked too)


def masked_url(url: str) -> str:
    """A state URL as logs and errors may show it: the password (and any credential-like query
    value) replaced by `***`, the user name, host, port, database and other options kept."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:***@{host}" if colon else f"{user}@{host}"
    query = urlencode([(name, "***" if any(word in name.lower() for word in _SECRET_PARAMS) else value)
                       for name, value in parse_qsl(parts.query, keep_blank_values=True)], safe="*")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def open_state(url: str | None = None) -> StateBackend:
    """The backend a state URL names; None reads $SLIPSTREAM_STATE_URL (unset: in process)."""
    url = url if url is not None else os.environ.get(STATE_URL_ENV, "")
    if not url or url == "local":
        spend_file = spend_file_from_env()  # `slipstream serve` keeps spend across restarts (sdk/state/spend_file.py)
        return LocalState(spend_file=SpendFile(spend_file) if spend_file is not None else None)
    if url.startswith(("redis://", "rediss://", "redis+", "rediss+")):
        from sdk.state.guard import GuardedState
        from sdk.state.redis import RedisState

        return GuardedState(RedisState(url))
    raise ValueError(f"state URL {masked_url(url)!r}: expected redis://HOST:PORT/DB, redis+sentinel://…, redis+cluster://… "
                     "or rediss… (or nothing, for in-process state)")


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


__all__ = ["STATE_URL_ENV", "StateBackend", "backend_status", "in_background", "masked_url", "open_state"]
