"""Heavy per-request work off the event loop, for large requests only.

A request whose body is at least `LARGE_BYTES` has its heavy steps (parsing, hashing, token
counting) run in a small pool of its own, so one team's big request does not hold every other
team's requests on the loop. Hashing and tiktoken release the GIL, so there they run beside the
loop; pure-Python work still shares the GIL, which is why the scans themselves are bounded too
(sdk/promptcache/volatility.py). A pool of its own, not asyncio's default one, so that big requests
cannot starve the other `to_thread` users (policy reloads, /metrics). Small requests stay on the
loop: a thread hop costs more than their work.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

LARGE_BYTES = 256 * 1024

_P = ParamSpec("_P")
_T = TypeVar("_T")
HEAVY_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="slipstream-heavy")


def is_large(size: int) -> bool:
    return size >= LARGE_BYTES


async def off_loop(fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """`fn(*args, **kwargs)` in the heavy-work pool."""
    return await asyncio.get_running_loop().run_in_executor(HEAVY_POOL, functools.partial(fn, *args, **kwargs))
