"""Heavy per-request work off the event loop, for large requests only.

A request whose body is at least `LARGE_BYTES` has its heavy steps (parsing, hashing, token
counting) run in a small pool of its own, so one team's big request does not hold every other
team's requests on the loop. Hashing and tiktoken release the GIL, so there they run beside the
loop; pure-Python work still shares the GIL, which is why the scans themselves are bounded too
(sdk/promptcache/volatility.py). A pool of its own, not asyncio's default one, so that big requests
cannot starve the other `to_thread` users (policy reloads, /metrics). Small requests stay on the
loop: a thread hop costs more than their work.

The pool serves its tenants (the team, `TENANT`, set by the door core once the team is known) in
turn: each tenant's work waits in a queue of its own, and a free thread takes the first of the
tenant that has waited longest for its turn. First come, first served let one team's queue of
big requests hold every other team's big request until all of it had run.

A serving process also shortens the interpreter's switch interval (`share_the_gil`): a thread
running pure Python keeps the GIL for up to the interval (5 ms by default) whenever the loop hands
it over, and the loop hands it over at every socket call, so a small request beside a big one waited
the interval several times over (`bench/isolation.py --part latency`, a team beside another's 5 MiB
requests against the same load on a second proxy: p50 +2.2 to +2.6 ms at 5 ms, +0.9 to +1.8 ms at
0.5 ms; the p99 of both sides is the 2-core machine's own, ±100 ms between runs).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import sys
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, ParamSpec, TypeVar

LARGE_BYTES = 256 * 1024
SWITCH_INTERVAL_S = 0.0005  # CPython's default: 0.005

_P = ParamSpec("_P")
_T = TypeVar("_T")
TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("slipstream_tenant", default="")


def _unbounded(size: int) -> None:
    """No body budget (a request from no door)."""


# The current request's claim on the process's budget of request bytes (sdk/door/bodies.py: its
# `BodyHold.need`, set by the door core): told the bytes the request holds in all, it takes what it
# does not hold yet, or raises the refusal. Work that makes a request hold more than its body (a
# Responses continuation's stored history) claims it before reading it.
HOLDING: contextvars.ContextVar[Callable[[int], None]] = contextvars.ContextVar("slipstream_holding", default=_unbounded)


class FairPool:
    """Worker threads that take work one tenant at a time, in turn."""

    def __init__(self, workers: int, name: str):
        self._workers = workers
        self._name = name
        self._waiting: dict[str, deque[tuple[Future[Any], contextvars.Context, Callable[[], Any]]]] = {}  # in turn order
        self._ready = threading.Condition()  # guards _waiting and _threads
        self._threads: list[threading.Thread] = []

    def submit(self, fn: Callable[[], _T], tenant: str | None = None) -> Future[_T]:
        """Run `fn` for `tenant` (by default the current one, `TENANT`), in the current context (work
        it submits is the current tenant's)."""
        future: Future[_T] = Future()
        with self._ready:
            waiting = self._waiting.setdefault(TENANT.get() if tenant is None else tenant, deque())
            waiting.append((future, contextvars.copy_context(), fn))
            self._ready.notify()
            while len(self._threads) < self._workers:
                self._threads.append(threading.Thread(target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True))
                self._threads[-1].start()
        return future

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._waiting:
                    self._ready.wait()
                tenant = next(iter(self._waiting))
                waiting = self._waiting.pop(tenant)
                future, context, fn = waiting.popleft()
                if waiting:
                    self._waiting[tenant] = waiting  # its next turn comes after every other tenant's
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = context.run(fn)
            except BaseException as exc:  # the caller's to handle, never the worker's end
                future.set_exception(exc)
            else:
                future.set_result(result)


HEAVY_POOL = FairPool(workers=2, name="slipstream-heavy")


def is_large(size: int) -> bool:
    return size >= LARGE_BYTES


async def off_loop(fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """`fn(*args, **kwargs)` in the heavy-work pool."""
    return await asyncio.wrap_future(HEAVY_POOL.submit(functools.partial(fn, *args, **kwargs)))


async def off_loop_if_large(size: int, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """`fn(*args, **kwargs)`: in the heavy-work pool when `size` bytes are large, else here (small work
    costs less than the hop to a thread)."""
    return await off_loop(fn, *args, **kwargs) if is_large(size) else fn(*args, **kwargs)


def share_the_gil() -> None:
    """For a serving process: the loop waits at most `SWITCH_INTERVAL_S` for the GIL a heavy-work
    thread holds (a library leaves the interpreter's settings to the application that imports it)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
