"""Turning tracing on from the environment: the standard OTLP variables, the `[otel]` extra imported lazily."""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

log = logging.getLogger("slipstream.tracing")

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
SAMPLER_VAR = "OTEL_TRACES_SAMPLER"


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


def from_environment() -> tuple[Any, Any, Any] | None:
    """(span processor, sampler or None, resource) for OTLP over HTTP/protobuf, or None when tracing stays off.

    The processor is the SDK's BatchSpanProcessor (it reads `OTEL_BSP_*`), the exporter reads the
    `OTEL_EXPORTER_OTLP_*` variables; the sampler is the SDK's reading of `OTEL_TRACES_SAMPLER` /
    `OTEL_TRACES_SAMPLER_ARG`, asked only when one is set (the default, parent-based always-on,
    needs no call). `OTEL_SDK_DISABLED=true` keeps tracing off.
    """
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if not otlp_wanted(ENDPOINT_VARS, "opentelemetry.exporter.otlp.proto.http.trace_exporter", "tracing is"):
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    sampler = TracerProvider(shutdown_on_exit=False).sampler if os.environ.get(SAMPLER_VAR) else None
    return BatchSpanProcessor(OTLPSpanExporter()), sampler, resource()
