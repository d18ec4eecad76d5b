"""A large request's plan, made in a worker thread, reads a scope's history no other request of its
team writes meanwhile (a race: a focused test, with the thread held at a known point)."""

from __future__ import annotations

import asyncio
import threading

from sdk.offload import LARGE_BYTES
from sdk.pipeline import PromptCacheReport
from sdk.policy import PromptCachePolicy
from sdk.promptcache import stage
from sdk.promptcache.ledger import Snapshot
from sdk.promptcache.stage import PromptCachePlanner
from sdk.types import Endpoint, LLMRequest, LLMResponse, Timings, Usage

MODEL = "claude-sonnet-5"
STATIC = "You are the support assistant.\n" + "Answer from the manual and cite the section. " * 400
MESSAGES = [{"role": "user", "content": "How do I reset the device?"}]


class _HeldChain(list[int]):
    """A snapshot's chain that holds the heavy-work thread reading it until the test lets it go."""

    def __init__(self) -> None:
        super().__init__([0] * 64)
        self.reading = threading.Event()
        self.go = threading.Event()

    def __len__(self) -> int:
        if threading.current_thread().name.startswith("slipstream-heavy") and not self.reading.is_set():
            self.reading.set()
            self.go.wait(30)
        return super().__len__()


def _request(system: str, size: int = 0) -> LLMRequest:
    return LLMRequest(Endpoint.MESSAGES, {"model": MODEL, "max_tokens": 16, "system": system, "messages": MESSAGES}, size=size)


def _answer() -> LLMResponse:
    return LLMResponse(200, b"{}", {}, Usage(input_tokens=10, cache_write_tokens=3000), f"anthropic/{MODEL}")


def test_a_plan_in_a_worker_thread_reads_a_history_nobody_appends_to_meanwhile(monkeypatch):
    """Request W writes a prefix; B, sharing it, waits for W's first byte (warm fan-out); A, large, is
    planned in the heavy-work pool and reads the scope's history there. W answers, B goes on: it
    appended its snapshot to that history on the event loop while A's thread was iterating it ("deque
    mutated during iteration": a 500 for the team). B's write of the ledger waits for A's plan now."""
    planner = PromptCachePlanner("plan-race", PromptCachePolicy(warm_fanout=True, fanout_max_wait_ms=600_000))
    optimizer = planner.optimizer
    chain = _HeldChain()
    scope = optimizer.ledger.scope("anthropic", MODEL, "")
    scope.history.append(Snapshot(chain, [], -1, 0, 0))  # read first by A's volatile-prefix check

    async def main() -> None:
        b_waiting, b_going_on, w_sent, w_release = asyncio.Event(), asyncio.Event(), asyncio.Event(), asyncio.Event()
        real_wait, real_repredict = stage.wait_for_writer, optimizer.repredict

        async def wait_for_writer(entry, max_wait_s):
            b_waiting.set()
            return await real_wait(entry, max_wait_s)

        def repredict(plan, now):
            real_repredict(plan, now)
            b_going_on.set()  # on the old code B's ledger writes follow in this same step of the loop

        monkeypatch.setattr(stage, "wait_for_writer", wait_for_writer)
        monkeypatch.setattr(optimizer, "repredict", repredict)

        async def send_w(request: LLMRequest) -> LLMResponse:
            w_sent.set()
            await w_release.wait()
            return _answer()

        async def send(request: LLMRequest) -> LLMResponse:
            return _answer()

        w = asyncio.create_task(planner.planned(_request(STATIC), send_w, Timings(), PromptCacheReport()))
        await w_sent.wait()
        b = asyncio.create_task(planner.planned(_request(STATIC), send, Timings(), PromptCacheReport()))
        await b_waiting.wait()
        volatile = STATIC + "\nSession id: sess_1a7f3c9d2e1"  # a volatile line: A's plan checks the history
        a = asyncio.create_task(planner.planned(_request(volatile, LARGE_BYTES), send, Timings(), PromptCacheReport()))
        assert await asyncio.to_thread(chain.reading.wait, 30), "A's plan did not read the history in the pool"
        w_release.set()
        await b_going_on.wait()
        chain.go.set()
        results = await asyncio.gather(w, b, a, return_exceptions=True)
        assert not [r for r in results if isinstance(r, BaseException)], results

    asyncio.run(main())
    assert len(scope.history) == 4  # the held snapshot, then W's, B's and A's
