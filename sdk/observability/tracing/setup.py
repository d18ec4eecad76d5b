"""Turning tracing on from the environment: the standard OTLP variables, the `[otel]` extra imported lazily."""

from __future__ import annotations

import atexit
import importlib
import logging
import os
from typing import Any

log = logging.getLogger("slipstream.tracing")

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
SAMPLER_VAR = "OTEL_TRACES_SAMPLER"
EXPORT_VAR = "SLIPSTREAM_TRACE_EXPORT"  # thread (default) | process: where spans are encoded and sent


def otlp_wanted(variables: tuple[str, ...], exporter_module: str, what: str) -> bool:
    """Whether one of `variables` names an OTLP endpoint and the `[otel]` extra is there (else one warning)."""
    if not any(os.environ.get(name) for name in variables):
        return False
    try:
        importlib.import_module(exporter_module)
    except ImportError as exc:
        log.warning("an OTLP endpoint is set but OpenTelemetry is not installed (%s): %s off; "
                    "install the extra with pip install 'slipstream[otel]'", exc, what)
        return False
    return True


def resource() -> Any:
    """The service's OpenTelemetry resource: `OTEL_SERVICE_NAME`, `slipstream` by default (and
    `OTEL_RESOURCE_ATTRIBUTES`, which the SDK reads)."""
    from opentelemetry.sdk.resources import Resource

    return Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "slipstream")})


def from_environment() -> tuple[Any, Any] | None:
    """(sink, sampler or None) for OTLP over HTTP/protobuf, or None when tracing stays off.

    The sink hands spans to the SDK's BatchSpanProcessor (it reads `OTEL_BSP_*`) and OTLP exporter
    (it reads `OTEL_EXPORTER_OTLP_*`): on a thread of this process, or, with
    `SLIPSTREAM_TRACE_EXPORT=process` (what `slipstream serve` sets unless it is given), in a child
    process (sdk/observability/tracing/export_process.py). The sampler is the SDK's reading of
    `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`, asked only when one is set (the default,
    parent-based always-on, needs no call). `OTEL_SDK_DISABLED=true` keeps tracing off.
    """
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if not otlp_wanted(ENDPOINT_VARS, "opentelemetry.exporter.otlp.proto.http.trace_exporter", "tracing is"):
        return None
    from opentelemetry.sdk.trace import TracerProvider

    sampler = TracerProvider(shutdown_on_exit=False).sampler if os.environ.get(SAMPLER_VAR) else None
    if os.environ.get(EXPORT_VAR, "thread") == "process":
        from sdk.observability.tracing.export_process import ProcessSink

        return ProcessSink(), sampler
    from sdk.observability.tracing.emit import Sink

    processor = otlp_processor()
    atexit.register(processor.shutdown)  # flush what the batch holds when the process ends
    return Sink(processor, resource()), sampler


def otlp_processor() -> Any:
    """The SDK's BatchSpanProcessor around its OTLP HTTP/protobuf exporter, both configured by `OTEL_*`."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    return BatchSpanProcessor(OTLPSpanExporter())
