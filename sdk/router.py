"""Routing: the first route whose match fits the model gives a fallback chain of targets.

Each target is tried with retries and backoff (full jitter, capped, honouring retry-after within
the cap) while nothing has reached the client. A stream counts as started once its first event has
arrived: the router pulls that event before answering, so a stream that fails at once is retried
like any other failure. After that, failures end the stream with a provider-shaped error event.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Mapping

from sdk.errors import NotFoundError, ProviderUnavailableError, SlipstreamError, UpstreamHTTPError, UpstreamTimeoutError, UpstreamUnreachableError
from sdk.pipeline import RequestContext
from sdk.policy import RetryPolicy, Route, Target
from sdk.providers.base import Provider
from sdk.types import Answer, LLMStream, close_after

log = logging.getLogger("slipstream.router")

# 401/403 from a provider mean *our* upstream key is wrong there: try the next target, never retry.
_NEXT_TARGET = {401, 403}
_RETRYABLE = {408, 409, 429, 500, 502, 503, 504, 529}


class StreamFailedBeforeFirstByte(Exception):
    def __init__(self, event: bytes, route: str):
        super().__init__(f"{route} failed before its first event")
        self.event = event


class Router:
    def __init__(self, routes: list[Route], providers: Mapping[str, Provider], retry: RetryPolicy):
        self.routes = routes
        self.providers = providers
        self.retry = retry

    def chain(self, model: str) -> list[Target]:
        for route in self.routes:
            if route.match.matches(model):
                return route.targets
        raise NotFoundError(f"no route for model {model!r} in this team's policy")

    async def __call__(self, ctx: RequestContext) -> Answer:
        last_error: Exception | None = None
        for target in self.chain(ctx.request.model):
            provider = self.providers[target.provider]
            request = ctx.request.with_model(target.model) if target.model else ctx.request
            for attempt in range(self.retry.max_attempts):
                try:
                    answer = await provider.send(request, ctx.timings)
                    if isinstance(answer, LLMStream):
                        answer = await _primed(answer, ctx)
                    ctx.route = answer.route
                    return answer
                except UpstreamHTTPError as exc:
                    last_error = exc
                    if exc.status in _NEXT_TARGET:
                        log.warning("%s rejected our upstream key (%d); trying the next target", exc.route, exc.status)
                        break
                    if exc.status not in _RETRYABLE:
                        raise
                    delay = self._delay(attempt, exc.headers)
                except ProviderUnavailableError as exc:
                    last_error = exc
                    break
                except (UpstreamUnreachableError, UpstreamTimeoutError, StreamFailedBeforeFirstByte) as exc:
                    last_error = exc
                    delay = self._delay(attempt, {})
                if delay is None or attempt + 1 == self.retry.max_attempts:
                    break
                started = time.perf_counter()
                await asyncio.sleep(delay)
                ctx.timings.upstream_s += time.perf_counter() - started
        if isinstance(last_error, StreamFailedBeforeFirstByte):
            raise SlipstreamError("every target failed before streaming; the last one sent an error event", status=502)
        assert last_error is not None
        raise last_error

    def _delay(self, attempt: int, headers: Mapping[str, str]) -> float | None:
        """Seconds to wait before the next attempt, or None to move on to the next target now."""
        cap = self.retry.max_delay_ms / 1000
        if self.retry.honor_retry_after:
            hinted = _retry_after(headers)
            if hinted is not None:
                return hinted if hinted <= cap else None
        return random.uniform(0, min(cap, self.retry.base_delay_ms / 1000 * 2**attempt))


def _retry_after(headers: Mapping[str, str]) -> float | None:
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value:
            try:
                return max(0.0, float(value) / scale)
            except ValueError:
                continue
    return None


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
