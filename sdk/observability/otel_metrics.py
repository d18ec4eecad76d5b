"""OpenTelemetry metrics with the GenAI semantic conventions, beside the Prometheus endpoint (not instead).

Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` is set: then the
first request sets up a MeterProvider with a PeriodicExportingMetricReader and the OTLP
HTTP/protobuf exporter (the SDK reads `OTEL_METRIC_EXPORT_INTERVAL` and the other standard
variables). Three histograms, recorded by the metrics stage when a request ends:
`gen_ai.client.operation.duration` (s), `gen_ai.client.token.usage` ({token}, by
`gen_ai.token.type` input/output) and `gen_ai.client.operation.time_to_first_chunk` (s, when a
first token arrived). Attributes are the operation, provider, models, team and `error.type`; the
models as the Prometheus labels have them (sdk/observability/metrics.py: `ModelLabels`, `RouteLabels`),
since a client names them: the SDK keeps every attribute set it is handed, and past 2,000 an
instrument records new ones as one overflow point, so one team inventing model names took the
series of every team that came after it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from sdk.observability.tracing import error_type, operation, otlp_wanted, resource
from sdk.types import Answer

if TYPE_CHECKING:
    from opentelemetry.metrics import Histogram, MeterProvider

    from sdk.pipeline import RequestContext

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
# The conventions' advised bucket boundaries: seconds for durations, powers of 4 for tokens.
_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)

_instruments: tuple[Histogram, Histogram, Histogram] | None = None
_decided = False


def install(provider: MeterProvider | None) -> None:
    """Record into `provider` (tests, an application's own); None turns these metrics off."""
    global _instruments, _decided
    _decided = True
    if provider is None:
        _instruments = None
        return
    meter = provider.get_meter("slipstream")
    _instruments = (
        meter.create_histogram("gen_ai.client.operation.duration", unit="s", description="GenAI operation duration",
                               explicit_bucket_boundaries_advisory=_DURATION_BUCKETS),
        meter.create_histogram("gen_ai.client.token.usage", unit="{token}", description="Tokens used by GenAI operations",
                               explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS),
        meter.create_histogram("gen_ai.client.operation.time_to_first_chunk", unit="s",
                               description="Time to the first token of a GenAI answer",
                               explicit_bucket_boundaries_advisory=_DURATION_BUCKETS),
    )


def reset() -> None:
    global _instruments, _decided
    _instruments, _decided = None, False


def _from_environment() -> None:
    if not otlp_wanted(ENDPOINT_VARS, "opentelemetry.exporter.otlp.proto.http.metric_exporter", "OpenTelemetry metrics are"):
        install(None)
        return
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    install(MeterProvider(metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())], resource=resource()))


def record(ctx: RequestContext, model: str, route: str, answer: Answer | None = None, error: BaseException | None = None) -> None:
    """Record one ended request (a no-op when these metrics are off); `model` is its requested model and
    `route` the route that answered, as labels (bounded per team)."""
    if not _decided:
        _from_environment()
    if _instruments is None:
        return
    duration, tokens, first_chunk = _instruments
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation(ctx.request.endpoint),
        "gen_ai.request.model": model,
        "slipstream.team": ctx.team,
    }
    if ctx.provider:
        attributes["gen_ai.provider.name"] = ctx.provider
    if "/" in route:
        attributes["gen_ai.response.model"] = route.split("/", 1)[1]
    if error is not None:
        attributes["error.type"] = error_type(error)
    duration.record(time.perf_counter() - ctx.timings.start, attributes)
    if ctx.timings.first_token is not None:
        first_chunk.record(ctx.timings.first_token - ctx.timings.start, attributes)
    if answer is not None:
        tokens.record(answer.usage.total_input_tokens, {**attributes, "gen_ai.token.type": "input"})
        tokens.record(answer.usage.output_tokens, {**attributes, "gen_ai.token.type": "output"})
