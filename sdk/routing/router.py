"""Routing: the first route whose match fits the model gives the targets; the router gets an answer.

Per request: the route's strategy orders its targets (sdk/routing/strategies.py); an attempt
budget (sdk/routing/attempts.py) decides which target is tried next and when: a failed target is
left for the next one at once and is ready again after its backoff, capped full jitter that
honours server hints within bounds (sdk/routing/backoff.py); a target's breaker is asked when an
attempt starts on it (sdk/routing/breaker.py). Every attempt is bounded by the first-byte timeout
and the whole request by `retry.deadline_ms`; with hedging on, a slow attempt gets a companion leg
in the same loop (losers cancelled by sdk/routing/hedging.py). A target of the other protocol is
reached through translation, and each attempt's body is planned for the prompt cache of the provider
it goes to, in that provider's protocol (sdk/promptcache/stage.py), after any translation.

A stream counts as answered once its first event has arrived: the router pulls that event before
returning, so a stream that fails at once is retried like any other failure. Once the router has
returned, the door sends headers and nothing is retried again: later failures end the stream with a
provider-shaped error event (sdk/providers/base.py). Every abandoned attempt is cancelled, which
drops its upstream connection. With tracing on, each attempt is a child span of the request's
(sdk/observability/tracing/) whose `traceparent` goes upstream.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from sdk.errors import NotFoundError, SlipstreamError, UpstreamHTTPError, UpstreamTimeoutError
from sdk.observability import tracing
from sdk.offload import off_loop_if_large
from sdk.pipeline import RequestContext
from sdk.policy import BreakerPolicy, HedgingPolicy, RetryPolicy, Route, Target
from sdk.providers.base import Provider
from sdk.responses.store import ResponseStore
from sdk.responses.target import ResponsesTarget
from sdk.routing.affinity import prefix_hashes
from sdk.routing.attempts import AttemptPlan, Leg, TargetSlot
from sdk.routing.backoff import (
    FirstByteTimeout,
    Step,
    StreamFailedBeforeFirstByte,
    TranslationRefused,
    blame,
    primed,
)
from sdk.routing.breaker import BreakerStore, InMemoryBreakerStore
from sdk.routing.hedging import discard
from sdk.routing.strategies import StatsBook, TargetStats, ordered_targets, target_key
from sdk.routing.translation import TranslatingProvider
from sdk.routing.translation.thinking_turns import WithoutThinking, foreign_tool_turn
from sdk.streams import on_end
from sdk.types import Answer, Endpoint, LLMRequest, LLMStream

if TYPE_CHECKING:
    from sdk.promptcache.stage import PromptCachePlanner

log = logging.getLogger("slipstream.router")


class Router:
    def __init__(
        self,
        routes: list[Route],
        providers: Mapping[str, Provider],
        retry: RetryPolicy,
        breaker: BreakerPolicy | None = None,
        hedging: HedgingPolicy | None = None,
        store: BreakerStore | None = None,
        team: str = "",
        responses: Callable[[], ResponseStore] | None = None,
        planner: PromptCachePlanner | None = None,
    ):
        self.routes = routes
        self.providers = providers
        self.retry = retry
        self.hedging = hedging or HedgingPolicy()
        self.breakers: BreakerStore = store or InMemoryBreakerStore(breaker or BreakerPolicy())
        self.stats = StatsBook()
        self.team = team
        self.responses = responses  # the team's response store, for Responses API targets
        self._responses: dict[str, ResponsesTarget] = {}
        self.planner = planner  # the team's prompt-cache planning, run on every attempt's upstream body

    def route_for(self, model: str) -> Route:
        for route in self.routes:
            if route.match.matches(model):
                return route
        raise NotFoundError(f"no route for model {model!r} in this team's policy")

    def chain(self, model: str) -> list[Target]:
        return self.route_for(model).targets

    async def __call__(self, ctx: RequestContext) -> Answer:
        """Attempts over the route's targets until one answers, the budget is spent or the deadline passes.

        Which target and when: sdk/routing/attempts.py. Without hedging one attempt runs at a time.
        With hedging, a leg that has gone without a first byte for the hedge delay is presumed slow,
        and the request keeps one leg more than it has slow ones, up to `hedging.max_legs`: a second
        leg starts when the first turns slow, a failed leg beside a slow one is replaced as soon as a
        target is ready (a stalled primary whose hedge failed never leaves the request waiting for
        its first-byte timeout), and with `max_legs: 3` a hedge that stalls too gets a third. The
        first leg to answer wins; the others are cancelled.
        """
        model = ctx.request.model
        route = self.route_for(model)
        # The prompt is serialized whole to be cut into blocks: a large one in the heavy-work pool, as the team's work.
        prefix = (await off_loop_if_large(ctx.request.size, prefix_hashes, ctx.request.body)
                  if route.strategy == "prefix_affinity" else [])
        order = ordered_targets(route, model, self.stats, prefix)
        keys = [target_key(t, model) for t in order]
        plan = AttemptPlan(order, keys, self.retry)
        deadline = math.inf if self.retry.deadline_ms is None else time.monotonic() + self.retry.deadline_ms / 1000
        max_legs = self.hedging.max_legs if self.hedging.enabled else 1
        legs: dict[asyncio.Task[Answer], Leg] = {}
        errors: list[BaseException] = []
        winner: asyncio.Task[Answer] | None = None
        try:
            while True:
                now = time.monotonic()
                if now >= deadline:
                    raise _deadline_error(errors)
                slow = sum(now >= leg.hedge_at for leg in legs.values())
                wake_at = deadline
                if len(legs) < min(max_legs, 1 + slow):
                    ready, later = plan.split(now)
                    slot = await self._claim(ready, force=not legs and later is None)
                    if slot is not None:
                        if legs:
                            log.info("hedging %s on %s: %d leg(s) without a first byte", model, slot.key, slow)
                        kind = _attempt_kind(slot, legs, errors, self.retry.max_attempts)
                        plan.started(slot)
                        # Each leg is a task of its own, also without hedging: awaited in the request's
                        # task instead, a request took about 6% more CPU at concurrency 64 (req/s 0.94x,
                        # bench/proxy_cpu.py, 2026-11-27), for no gain at concurrency 1.
                        hedge_at = now + self._hedge_delay_s(slot.key) if max_legs > 1 else math.inf
                        legs[asyncio.ensure_future(self._attempt(ctx, slot, deadline, kind))] = Leg(slot, hedge_at)
                        continue
                    if later is None and not legs:
                        raise _final_error(errors)
                    if later is not None:
                        wake_at = min(wake_at, later)
                elif len(legs) < max_legs:  # one more leg once another running one turns slow
                    wake_at = min(wake_at, min(leg.hedge_at for leg in legs.values() if leg.hedge_at > now))
                if not legs:  # every target is backing off
                    if wake_at >= deadline:
                        raise _deadline_error(errors)  # the wait alone would pass the deadline
                    log.info("retrying %s in %.3fs after %s", model, wake_at - now, errors[-1])
                    with ctx.timings.upstream():  # waiting out a provider's backoff is not the gateway's time
                        await asyncio.sleep(wake_at - now)
                    continue
                timeout = None if math.isinf(wake_at) else max(0.0, wake_at - time.monotonic())
                done, _ = await asyncio.wait(legs, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=lambda t: t.exception() is not None):  # an answer first
                    slot = legs.pop(task).slot
                    error = task.exception()
                    if error is None:
                        winner = task
                        return self._answered(ctx, plan, slot, task.result(), prefix, keys if not errors else ())
                    if plan.failed(slot, error, time.monotonic()).step is Step.FAIL:
                        raise error
                    errors.append(error)
        except UpstreamHTTPError as exc:
            ctx.route = exc.route  # the provider's error is the answer: its route is named (access log, metrics)
            raise
        finally:
            for task in legs:
                if task is not winner and await discard(task):  # it answered in the same instant: billed too
                    ctx.abandoned.append(legs[task].slot.target.model or model)

    def _answered(self, ctx: RequestContext, plan: AttemptPlan, slot: TargetSlot, answer: Answer,
                  prefix: list[bytes], keep: Collection[str]) -> Answer:
        """The request's answer from `slot`: recorded in the plan, the prefix owners and the context."""
        plan.finished(slot)
        if prefix:  # the replica that answered now holds this prefix; after a failure, `keep` is empty: it hands it on
            self.stats.prefix_owners.remember(prefix, slot.key, keep)
        ctx.route = answer.route
        ctx.provider = tracing.provider_name(self.providers[slot.target.provider])
        return answer

    async def _claim(self, ready: list[TargetSlot], force: bool) -> TargetSlot | None:
        """The first ready target whose breaker admits an attempt now.

        With `force` (nothing running, nothing backing off) and every circuit open, the first one
        anyway: with no healthy alternative a synthetic 503 would only hide the provider's own error.
        """
        for slot in ready:
            if await self.breakers.acquire(slot.key):
                return slot
        return ready[0] if force and ready else None

    def _hedge_delay_s(self, key: str) -> float:
        if self.hedging.delay_ms is not None:
            return self.hedging.delay_ms / 1000
        p95 = self.stats[key].p95_ttfb_s(self.hedging.min_samples)
        return p95 if p95 is not None else self.hedging.default_delay_ms / 1000

    async def _attempt(self, ctx: RequestContext, slot: TargetSlot, deadline: float, kind: str = "first") -> Answer:
        """One upstream call, up to its first byte; its outcome feeds the breaker and the statistics.
        `kind` (first, retry, fallback, hedge) only names the attempt in its trace span."""
        target, key = slot.target, slot.key
        stats = self.stats[key]
        request = ctx.request.with_model(target.model) if target.model else ctx.request
        provider = self._provider(target.provider, request, ctx)
        limit = self._first_byte_limit_s(deadline)
        stats.in_flight += 1
        ctx.attempts += 1
        span, request = tracing.begin_attempt(ctx, key, self.providers[target.provider], request, kind)
        started = time.perf_counter()
        try:
            try:
                async with asyncio.timeout(limit):
                    answer = await provider.send(request, ctx.timings)
                    if isinstance(answer, LLMStream):
                        answer = await primed(answer, ctx.timings)
            except TimeoutError:
                assert limit is not None  # only a limit times out
                ctx.abandoned.append(request.model)  # dropped while the provider read its prompt
                raise FirstByteTimeout(f"{key} sent no first byte within {limit * 1000:.0f} ms") from None
        except asyncio.CancelledError:
            ctx.abandoned.append(request.model)  # a hedge that lost, or its request gone: the prompt was read
            stats.in_flight -= 1
            tracing.end_attempt(span, "cancelled")
            await self.breakers.release(key)  # a cancelled attempt says nothing about the target
            raise
        except BaseException as exc:
            stats.in_flight -= 1
            tracing.end_attempt(span, "failed", exc)
            verdict = blame(exc)
            if verdict.failed:
                stats.failure()
                await self.breakers.record(key, failed=True, open_now=verdict.open_now)
            else:
                await self.breakers.release(key)
            raise
        tracing.end_attempt(span, "ok")
        stats.success(time.perf_counter() - started)
        await self.breakers.record(key, failed=False)
        if isinstance(answer, LLMStream):
            on_end(answer, lambda _completed: _leave(stats))  # a stream is busy until it ends (least_busy)
        else:
            stats.in_flight -= 1
        return answer

    def _first_byte_limit_s(self, deadline: float) -> float | None:
        limit = max(0.0, deadline - time.monotonic())
        if self.retry.first_byte_timeout_ms is not None:
            limit = min(limit, self.retry.first_byte_timeout_ms / 1000)
        return None if math.isinf(limit) else limit

    def _provider(self, name: str, request: LLMRequest, ctx: RequestContext) -> Provider:
        """The target `name` for this attempt: its provider, planned for its own prompt cache, behind
        whatever translation the client's protocol needs."""
        provider = self.providers[name]
        upstream = self.planner.attempt(provider, ctx) if self.planner is not None else provider
        if request.endpoint in (Endpoint.RESPONSES, Endpoint.RESPONSES_INPUT_TOKENS, Endpoint.RESPONSES_COMPACT):
            return self._responses_target(name, provider).via(upstream)
        if provider.protocol is request.protocol:
            # a Claude tool loop with thinking whose turn another provider opened: without thinking (thinking_turns.py)
            return WithoutThinking(upstream) if foreign_tool_turn(request) else upstream
        return TranslatingProvider(upstream, request.protocol, provider, ctx)

    def _responses_target(self, name: str, provider: Provider) -> ResponsesTarget:
        """The provider behind its Responses adapter (native or translated), kept for the policy's life:
        it remembers whether an `auto` upstream turned out to lack /responses."""
        target = self._responses.get(name)
        if target is None:
            if self.responses is None:
                raise SlipstreamError("this router has no response store; the Responses API is not available", status=501)
            target = self._responses[name] = ResponsesTarget(provider, self.team, self.responses)
        return target


def _attempt_kind(slot: TargetSlot, legs: Mapping[Any, Leg], errors: list[BaseException], max_attempts: int) -> str:
    """How an attempt about to start relates to the earlier ones: a hedge leg beside a running one, a
    retry of a target tried before, a fallback to another target after a failure, or the first."""
    if legs:
        return "hedge"
    if slot.attempts_left < max_attempts:
        return "retry"
    return "fallback" if errors else "first"


def _leave(stats: TargetStats) -> None:
    stats.in_flight -= 1


def _deadline_error(errors: list[BaseException]) -> UpstreamTimeoutError:
    last = f"; last error: {errors[-1]}" if errors else ""
    return UpstreamTimeoutError(f"request deadline passed after {len(errors)} failed attempts{last}")


def _final_error(errors: list[BaseException]) -> BaseException:
    """The error to answer with when every target failed: the last upstream one, else a refusal."""
    upstream = [e for e in errors if not isinstance(e, TranslationRefused)]
    if not errors:
        return SlipstreamError("no target could be tried", status=503)
    last = (upstream or errors)[-1]
    if isinstance(last, StreamFailedBeforeFirstByte):
        return SlipstreamError("every target failed before streaming; the last one sent an error event", status=502)
    return last
