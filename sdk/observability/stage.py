"""The metrics stage: in-flight gauge, errors, latency histograms and the percentile monitor.

It wraps everything after it, so upstream time, retries and cache hits are all inside its clock.
A stream is recorded when it ends, however it ends (finished, failed, or closed by the client).
The same points write the access log line, open and close the request's trace span, record the
OpenTelemetry metrics and feed the status page's buckets (sdk/observability/access_log.py, sdk/observability/tracing/,
sdk/observability/otel_metrics.py, sdk/observability/live_stats.py), each when it is on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from sdk.errors import SlipstreamError, UpstreamHTTPError
from sdk.observability import access_log, live_stats, metrics, otel_metrics, tracing
from sdk.pipeline import Handler, RequestContext
from sdk.policy import Policy
from sdk.services import Services
from sdk.streams import on_end
from sdk.types import Answer, LLMResponse, LLMStream


class MetricsStage:
    name = "metrics"

    def __init__(self, team: str, monitor: metrics.PercentileMonitor, labels: metrics.RouteLabels, models: metrics.ModelLabels):
        self.team = team
        self.monitor = monitor
        self.labels = labels
        self.models = models  # the OpenTelemetry metrics' request model, which a client names
        self.in_flight = metrics.IN_FLIGHT.labels(team)
        self.overhead = metrics.OVERHEAD.labels(team)

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Answer:
        self.in_flight.inc()
        tracing.begin(ctx)
        try:
            answer = await call_next(ctx)
        except asyncio.CancelledError:
            self.in_flight.dec()
            metrics.CANCELLED.labels(self.team).inc()
            self._report(ctx, "cancelled")
            raise
        except (SlipstreamError, UpstreamHTTPError) as exc:
            self.in_flight.dec()
            kind = type(exc).__name__ if isinstance(exc, SlipstreamError) else f"upstream_{exc.status}"
            metrics.ERRORS.labels(self.team, kind).inc()
            metrics.REQUESTS.labels(self.team, self.labels(ctx.route or "none"), str(exc.status)).inc()
            self._report(ctx, exc.status, error=exc)
            raise
        except BaseException as exc:
            self.in_flight.dec()
            tracing.end(ctx, 500, error=exc)
            otel_metrics.record(ctx, self.models(ctx.request.model), self.labels(ctx.route or "none"), error=exc)
            live_stats.record(ctx, self.labels(ctx.route or "none"), 500)
            raise
        self.overhead.observe(max(0.0, time.perf_counter() - ctx.timings.start - ctx.timings.upstream_s))
        if isinstance(answer, LLMResponse):
            self.in_flight.dec()
            self._finish(ctx, answer, streamed=False)
            return answer
        failed: list[bytes] = []
        on_end(answer, lambda completed: self._stream_ended(ctx, answer, completed, failed), _error_watch(failed))
        return answer

    def _finish(self, ctx: RequestContext, answer: Answer, streamed: bool) -> None:
        route = self.labels(answer.route)
        metrics.child(metrics.REQUESTS, self.team, route, str(answer.status)).inc()
        latency = metrics.record(self.team, route, ctx.timings, answer.usage, streamed)
        self.monitor.observe(*latency)
        self._report(ctx, answer.status, answer, latency=latency)

    def _stream_ended(self, ctx: RequestContext, stream: LLMStream, completed: bool, failed: list[bytes]) -> None:
        self.in_flight.dec()
        if failed:  # ended by an error event (the provider's, or ours mid-stream): a failure, not a 200
            metrics.ERRORS.labels(self.team, "stream_error").inc()
            metrics.REQUESTS.labels(self.team, self.labels(stream.route), "stream_error").inc()
            self._report(ctx, "stream_error", stream)
        elif completed:
            self._finish(ctx, stream, streamed=True)
        else:
            metrics.CANCELLED.labels(self.team).inc()
            self._report(ctx, "cancelled", stream)

    def _report(self, ctx: RequestContext, status: int | str, answer: Answer | None = None, error: BaseException | None = None,
                latency: tuple[float, float] | None = None) -> None:
        """The ended request to the access log, its trace span, the OpenTelemetry metrics and the status
        page's buckets (each a no-op when off); `latency` is (TTFT, e2e) of an answered request."""
        usage = answer.usage if answer is not None else None
        access_log.record(ctx, status, usage)
        tracing.end(ctx, status, answer, error)
        route = answer.route if answer is not None else error.route if isinstance(error, UpstreamHTTPError) else ctx.route
        label = self.labels(route or "none")
        otel_metrics.record(ctx, self.models(ctx.request.model), label, answer, error)
        live_stats.record(ctx, label, status, usage, latency)


def _is_error_event(item: bytes) -> bool:
    """Whether an item (one or more whole SSE events) holds an error event, in either dialect."""
    return item.startswith((b"event: error", b'data: {"error"')) or b"\n\nevent: error" in item or b'\n\ndata: {"error"' in item


def _error_watch(failed: list[bytes]) -> Callable[[bytes], None]:
    """An observer that keeps the items holding an error event."""
    def watch(item: bytes) -> None:
        if _is_error_event(item):
            failed.append(item)
    return watch


def build_metrics(policy: Policy, services: Services) -> MetricsStage:
    return MetricsStage(policy.team, metrics.PercentileMonitor(policy.team, policy.alerts), metrics.RouteLabels(policy),
                        metrics.ModelLabels(policy))
