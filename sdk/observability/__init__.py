"""What the gateway shows about the requests it handles (docs/observability.md).

stage.py         the metrics stage: wraps everything inside it and reports each ended request once
metrics.py       Prometheus metrics (one registry)
access_log.py    one JSON line per answer, keyed by request id
live_stats.py    the status page's 10-second buckets
otel_metrics.py  OpenTelemetry GenAI metrics
tracing/         request spans (plain records until the request ends), OTLP encoding and export
"""
