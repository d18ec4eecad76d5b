"""Worker threads that serve their tenants in turn: the engine server's pool for reading large bodies.

Reading a body of a few MiB (JSON, the chat template, the tokenizer) takes seconds, so the server does
it in a thread. asyncio's default pool took that work first come, first served: one tenant's queue of
large requests held every other tenant's until all of it had run. Here each tenant's work waits in a
queue of its own, and a free thread takes the first of the tenant that has waited longest for its turn
(the rule of the gateway's heavy-work pool, sdk/offload.py:FairPool; the engine does not import the
gateway).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

_T = TypeVar("_T")


class FairExecutor:
    def __init__(self, workers: int, name: str):
        self._workers = workers
        self._name = name
        self._waiting: dict[str, deque[tuple[Future[Any], Callable[[], Any]]]] = {}  # in turn order
        self._ready = threading.Condition()  # guards _waiting and _threads
        self._threads: list[threading.Thread] = []

    def submit(self, tenant: str, fn: Callable[[], _T]) -> Future[_T]:
        future: Future[_T] = Future()
        with self._ready:
            self._waiting.setdefault(tenant, deque()).append((future, fn))
            self._ready.notify()
            while len(self._threads) < self._workers:
                self._threads.append(threading.Thread(target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True))
                self._threads[-1].start()
        return future

    def waiting(self) -> dict[str, int]:
        """Tenant → how many of its calls wait for a thread."""
        with self._ready:
            return {tenant: len(calls) for tenant, calls in self._waiting.items()}

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._waiting:
                    self._ready.wait()
                tenant = next(iter(self._waiting))
                waiting = self._waiting.pop(tenant)
                future, fn = waiting.popleft()
                if waiting:
                    self._waiting[tenant] = waiting  # its next turn comes after every other tenant's
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn()
            except BaseException as exc:  # the caller's to handle, never the worker's end
                future.set_exception(exc)
            else:
                future.set_result(result)
