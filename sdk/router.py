"""Routing: the first route whose match fits the model gives the targets; the router gets an answer.

Per request: the route's strategy orders its targets (sdk/routing/strategies.py); targets whose
circuit is open are skipped while another remains (sdk/routing/breaker.py); the router makes up to
`retry.max_attempts` rounds over the targets, moving to the next target at once after a failure
and backing off between rounds with capped full-jitter backoff that honours server hints within
bounds (sdk/routing/backoff.py), every attempt bounded by the first-byte timeout and the whole
request by `retry.deadline_ms`; with hedging on, a slow attempt races the next target
(sdk/routing/hedging.py). A target of the other protocol is reached through translation.

A stream counts as answered once its first event has arrived: the router pulls that event before
returning, so a stream that fails at once is retried like any other failure. Once the router has
returned, the door sends headers and nothing is retried again: later failures end the stream with a
provider-shaped error event (sdk/providers/base.py). Every abandoned attempt is cancelled, which
drops its upstream connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping

from sdk.errors import NotFoundError, SlipstreamError, UpstreamTimeoutError
from sdk.pipeline import RequestContext
from sdk.policy import BreakerPolicy, HedgingPolicy, RetryPolicy, Route, Target
from sdk.providers.base import Provider
from sdk.routing.backoff import (
    FirstByteTimeout,
    Step,
    StreamFailedBeforeFirstByte,
    TranslationRefused,
    backoff_delay,
    blame,
    decide,
)
from sdk.routing.breaker import BreakerStore, InMemoryBreakerStore
from sdk.routing.hedging import AllLegsFailed, race
from sdk.routing.strategies import StatsBook, TargetStats, ordered_targets, target_key
from sdk.routing.translation import TranslatingProvider
from sdk.streams import close_after, on_end
from sdk.types import Answer, LLMStream, Protocol

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
    ):
        self.routes = routes
        self.providers = providers
        self.retry = retry
        self.hedging = hedging or HedgingPolicy()
        self.breakers: BreakerStore = store or InMemoryBreakerStore(breaker or BreakerPolicy())
        self.stats = StatsBook()
        self._translating: dict[tuple[str, Protocol], Provider] = {}

    def route_for(self, model: str) -> Route:
        for route in self.routes:
            if route.match.matches(model):
                return route
        raise NotFoundError(f"no route for model {model!r} in this team's policy")

    def chain(self, model: str) -> list[Target]:
        return self.route_for(model).targets

    async def __call__(self, ctx: RequestContext) -> Answer:
        """Rounds over the route: each round tries every target still in play once, in order.

        A failed attempt moves on to the next target at once: waiting on a busy or failing target
        while another could answer only adds latency. Between rounds the router backs off (the
        shortest server hint of the round, else full-jitter backoff), so every target gets
        `retry.max_attempts` attempts in all, and a target that failed early in a round is tried
        again after the others rather than abandoned.
        """
        model = ctx.request.model
        order = ordered_targets(self.route_for(model), model, self.stats)
        deadline = None if self.retry.deadline_ms is None else time.monotonic() + self.retry.deadline_ms / 1000
        errors: list[BaseException] = []
        in_play = list(order)
        for round_ in range(self.retry.max_attempts):
            allowed = [t for t in in_play if await self.breakers.acquire(target_key(t, model))]
            # Every circuit open: a breaker steers to a healthy alternative and there is none, so try
            # them anyway rather than hide the provider's own error behind ours.
            hints: list[float] = []
            for target in allowed or in_play:
                if deadline is not None and time.monotonic() >= deadline:
                    raise _deadline_error(errors)
                try:
                    answer = await self._hedged(ctx, target, in_play, deadline)
                except AllLegsFailed as exc:
                    error: BaseException = exc.errors[0]
                except Exception as exc:  # noqa: BLE001 - classified below; unknown kinds are re-raised
                    error = exc
                else:
                    ctx.route = answer.route
                    return answer
                decision = decide(error, round_, self.retry)
                if decision.step is Step.FAIL:
                    raise error
                errors.append(error)
                if decision.step is Step.RETRY:
                    hints.append(decision.delay_s)
                elif not isinstance(error, FirstByteTimeout):  # a stall may pass; a refusal will not
                    in_play.remove(target)
            if not in_play or round_ + 1 == self.retry.max_attempts:
                break
            delay = min(hints) if hints else backoff_delay(round_, {}, self.retry) or 0.0
            if deadline is not None and time.monotonic() + delay >= deadline:
                raise _deadline_error(errors)  # the wait alone would pass the deadline
            log.info("retrying %s in %.3fs after %s", model, delay, errors[-1])
            started = time.perf_counter()
            await asyncio.sleep(delay)
            ctx.timings.upstream_s += time.perf_counter() - started
        raise _final_error(errors)

    async def _hedged(self, ctx: RequestContext, target: Target, in_play: list[Target], deadline: float | None) -> Answer:
        """One attempt on `target`; with hedging on, the next target in play races it after a delay."""
        others = [t for t in in_play if t is not target]
        if not self.hedging.enabled or not others:
            return await self._attempt(ctx, target, deadline)
        model = ctx.request.model

        async def hedge_leg() -> Answer:
            errors: list[BaseException] = []
            for other in others:
                if await self.breakers.acquire(target_key(other, model)):
                    log.info("hedging %s with %s", target_key(target, model), target_key(other, model))
                    try:
                        return await self._attempt(ctx, other, deadline)
                    except Exception as exc:  # noqa: BLE001 - the primary leg is still running
                        errors.append(exc)
            raise _final_error(errors)

        answer, _ = await race(lambda: self._attempt(ctx, target, deadline), self._hedge_delay_s(target, model), hedge_leg)
        return answer

    def _hedge_delay_s(self, target: Target, model: str) -> float:
        if self.hedging.delay_ms is not None:
            return self.hedging.delay_ms / 1000
        p95 = self.stats[target_key(target, model)].p95_ttfb_s(self.hedging.min_samples)
        return p95 if p95 is not None else self.hedging.default_delay_ms / 1000

    async def _attempt(self, ctx: RequestContext, target: Target, deadline: float | None) -> Answer:
        """One upstream call, up to its first byte; its outcome feeds the breaker and the statistics."""
        key = target_key(target, ctx.request.model)
        stats = self.stats[key]
        request = ctx.request.with_model(target.model) if target.model else ctx.request
        provider = self._provider(target.provider, request.protocol)
        limit = self._first_byte_limit_s(deadline)
        stats.in_flight += 1
        started = time.perf_counter()
        try:
            try:
                async with asyncio.timeout(limit):
                    answer = await provider.send(request, ctx.timings)
                    if isinstance(answer, LLMStream):
                        answer = await _primed(answer, ctx)
            except TimeoutError:
                raise FirstByteTimeout(f"{key} sent no first byte within {limit * 1000:.0f} ms") from None
        except asyncio.CancelledError:
            stats.in_flight -= 1
            await self.breakers.release(key)  # a cancelled attempt says nothing about the target
            raise
        except BaseException as exc:
            stats.in_flight -= 1
            verdict = blame(exc)
            if verdict.failed:
                stats.failure()
                await self.breakers.record(key, failed=True, open_now=verdict.open_now)
            else:
                await self.breakers.release(key)
            raise
        stats.success(time.perf_counter() - started)
        await self.breakers.record(key, failed=False)
        if isinstance(answer, LLMStream):
            on_end(answer, lambda _completed: _leave(stats))  # a stream is busy until it ends (least_busy)
        else:
            stats.in_flight -= 1
        return answer

    def _first_byte_limit_s(self, deadline: float | None) -> float | None:
        limits = []
        if self.retry.first_byte_timeout_ms is not None:
            limits.append(self.retry.first_byte_timeout_ms / 1000)
        if deadline is not None:
            limits.append(max(0.0, deadline - time.monotonic()))
        return min(limits) if limits else None

    def _provider(self, name: str, protocol: Protocol) -> Provider:
        provider = self.providers[name]
        if provider.protocol is protocol:
            return provider
        translating = self._translating.get((name, protocol))
        if translating is None:
            translating = self._translating[(name, protocol)] = TranslatingProvider(provider, protocol)
        return translating


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


async def _primed(stream: LLMStream, ctx: RequestContext) -> LLMStream:
    """Wait for the first event, so a stream that fails at once can still be retried."""
    started = time.perf_counter()
    try:
        first = await anext(stream.events)
    except StopAsyncIteration:
        first = b""
    except BaseException:
        await stream.aclose()
        raise
    finally:
        ctx.timings.upstream_s += time.perf_counter() - started
    if first.startswith(b"event: error") or first.startswith(b'data: {"error"') or not first:
        await stream.aclose()
        raise StreamFailedBeforeFirstByte(first, stream.route)
    stream.events = _prepend(first, stream.events)
    return stream


async def _prepend(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        yield first
        async for event in rest:
            yield event
    finally:
        await close_after(rest)
