"""Heavy per-request work off the event loop, for large requests only.

A request whose body is at least `LARGE_BYTES` has its heavy steps (parsing, hashing, token
counting) run in a small pool of its own, so one team's big request does not hold every other
team's requests on the loop. Hashing and tiktoken release the GIL, so there they run beside the
loop; pure-Python work still shares the GIL, which is why the scans themselves are bounded too
(sdk/promptcache/volatility.py). A pool of its own, not asyncio's default one, so that big requests
cannot starve the other `to_thread` users (policy reloads, /metrics). Small requests stay on the
loop: a thread hop costs more than their work.

A serving process also shortens the interpreter's switch interval (`share_the_gil`): a thread
running pure Python keeps the GIL for up to the interval (5 ms by default) whenever the loop hands
it over, and the loop hands it over at every socket call, so a small request beside a big one waited
the interval several times over (`bench/isolation.py --part latency`, a team beside another's 5 MiB
requests against the same load on a second proxy: p50 +2.2 to +2.6 ms at 5 ms, +0.9 to +1.8 ms at
0.5 ms; the p99 of both sides is the 2-core machine's own, ±100 ms between runs).
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

LARGE_BYTES = 256 * 1024
SWITCH_INTERVAL_S = 0.0005  # CPython's default: 0.005

_P = ParamSpec("_P")
_T = TypeVar("_T")
HEAVY_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="slipstream-heavy")


def is_large(size: int) -> bool:
    return size >= LARGE_BYTES


async def off_loop(fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """`fn(*args, **kwargs)` in the heavy-work pool."""
    return await asyncio.get_running_loop().run_in_executor(HEAVY_POOL, functools.partial(fn, *args, **kwargs))


def share_the_gil() -> None:
    """For a serving process: the loop waits at most `SWITCH_INTERVAL_S` for the GIL a heavy-work
    thread holds (a library leaves the interpreter's settings to the application that imports it)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
