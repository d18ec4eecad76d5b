"""Readiness: load what the served policies need before saying ready, and say how long each part took.

Parts are the heavy things a request would otherwise load on first use: the local engine's model,
the MiniLM embedder, the token-pruning model. A provider or stage that has one declares it with
`warm_ups()`; `TeamRuntime.warm_ups()` gathers them and `Readiness` loads each once per process
(by name: two teams sharing the demo model load it once), in a worker thread, never on the
event loop, one part at a time: two threads importing torch's module graph at once can each hold a
module lock the other needs, and Python breaks that deadlock by handing one of them a partially
initialised module (an ImportError that failed the local engine's warm-up beside the embedder's:
the engine's import ran outside `sdk/services.py:MODEL_LOAD_LOCK`, now inside it; this order keeps
a warm-up that forgets the lock from meeting the same). The proxy answers `GET /readyz` with 503 and the parts' states until every part is
loaded, then 200; `GET /healthz` stays liveness only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

log = logging.getLogger("slipstream.readiness")


@dataclass(frozen=True)
class WarmUp:
    """One part to load: `load` blocks until it is ready (run in a worker thread); then `rehearse`,
    if given, runs on the serving event loop (one request's worth of work, so the first client
    request does not pay first-use costs on that loop)."""

    name: str
    load: Callable[[], object]
    rehearse: Callable[[], Awaitable[object]] | None = None


@runtime_checkable
class HasWarmUps(Protocol):
    def warm_ups(self) -> list[WarmUp]: ...


@dataclass
class Part:
    state: Literal["loading", "ready", "failed"] = "loading"
    seconds: float | None = None
    error: str | None = None


@dataclass
class Readiness:
    parts: dict[str, Part] = field(default_factory=dict)
    _started: float = field(default_factory=time.perf_counter, init=False)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False, repr=False)
    _loading: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)  # one load at a time

    def start(self, warm_ups: Iterable[WarmUp]) -> None:
        """Begin loading every part not yet known (call on the event loop; returns at once)."""
        for warm_up in warm_ups:
            if warm_up.name in self.parts:
                continue
            self.parts[warm_up.name] = Part()
            task = asyncio.create_task(self._load(warm_up))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if not self._tasks and not self.parts:
            log.info("ready: the served policies need nothing loaded")

    async def wait(self) -> None:
        """Until every part started so far has finished loading or failed (tests, the CLI)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks))

    @property
    def ready(self) -> bool:
        return all(part.state == "ready" for part in self.parts.values())

    def body(self) -> dict[str, object]:
        states = {part.state for part in self.parts.values()}
        status = "ready" if self.ready else "failed" if "failed" in states else "loading"
        parts = {name: {k: v for k, v in vars(part).items() if v is not None} for name, part in self.parts.items()}
        return {"status": status, "parts": parts}

    async def _load(self, warm_up: WarmUp) -> None:
        part = self.parts[warm_up.name]
        started = time.perf_counter()
        try:
            async with self._loading:
                await asyncio.to_thread(warm_up.load)
            if warm_up.rehearse is not None:
                await warm_up.rehearse()
        except Exception as exc:  # reported by /readyz and the log; the proxy stays up (liveness)
            part.state, part.error = "failed", f"{type(exc).__name__}: {exc}"
            log.error("loading %s failed after %.1f s: %s", warm_up.name, time.perf_counter() - started, part.error)
        else:
            part.state = "ready"
            log.info("loaded %s in %.1f s", warm_up.name, time.perf_counter() - started)
        finally:
            part.seconds = round(time.perf_counter() - started, 3)
        if self.ready:
            log.info("ready: %s loaded, %.1f s after start", ", ".join(self.parts), time.perf_counter() - self._started)
