"""What OpenAI batches and Anthropic message batches share: a job that waits
`batch_delay_ms` (queueing), then runs its requests one by one through the emulator's own
handlers in process (so each line is answered exactly as a direct call would be, caching and
validation included, but without faults), and can be cancelled between requests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from .app import Emulator


@dataclass(slots=True)
class LineResult:
    custom_id: str
    status: int  # HTTP status of the answer (0: not run, the batch was cancelled first)
    body: Any  # parsed JSON answer


@dataclass
class BatchJob:
    key: str
    obj: dict[str, Any]  # the provider's batch object, updated as the job runs
    results: list[LineResult] = field(default_factory=list)
    cancel_requested: bool = False
    task: asyncio.Task[None] | None = None


@dataclass
class BatchStore:
    entries: dict[str, BatchJob] = field(default_factory=dict)

    def get(self, bid: str, key: str, kind: tuple[str, str]) -> BatchJob | None:
        """The batch `bid` if it is `key`'s and of this `kind` (field, value): both providers'
        batches share this store."""
        b = self.entries.get(bid)
        return b if b is not None and b.key == key and b.obj.get(kind[0]) == kind[1] else None

    def clear(self) -> None:
        for b in self.entries.values():
            if b.task is not None:
                b.task.cancel()
        self.entries.clear()


def start(emu: Emulator, job: BatchJob, path: str, headers: dict[str, str],
          requests: list[tuple[str, dict[str, Any]]], on_start: Callable[[], None],
          on_result: Callable[[LineResult], None], on_end: Callable[[], None]) -> None:
    """Run `requests` ((custom_id, body) pairs) against POST `path` in the background."""

    async def run() -> None:
        await asyncio.sleep(emu.config.batch_delay_ms / 1000.0)
        if not job.cancel_requested:
            on_start()
        for custom_id, body in requests:
            if job.cancel_requested:
                res = LineResult(custom_id, 0, None)
            else:
                status, raw = await emu.run_internal("POST", path, headers, orjson.dumps(body))
                res = LineResult(custom_id, status, orjson.loads(raw) if raw else None)
            job.results.append(res)
            on_result(res)
            await asyncio.sleep(0)  # let a cancel arrive between lines
        on_end()

    job.task = asyncio.get_running_loop().create_task(run())
