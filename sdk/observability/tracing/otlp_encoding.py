"""OTLP protobuf bytes straight from Slipstream's span records, for the export child process.

The SDK's encoder builds one protobuf object per attribute and costs ~120 µs a span on the
benchmark machine; writing the wire format directly costs ~25 µs (bench/tracing_overhead.py). The output is the
same `ExportTraceServiceRequest` the SDK would send for these spans (tests/sdk/test_trace_export.py
parses both and compares them), handed to the SDK's own OTLP HTTP exporter (`Encoded`), so
endpoints, headers, compression, timeouts and retries stay the SDK's.

Wire format: https://protobuf.dev/programming-guides/encoding/ ; messages:
opentelemetry/proto/trace/v1/trace.proto and common/v1/common.proto.

Span names and string attribute values are cut at the OpenTelemetry attribute value length limit
(`OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT`, else `OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`, else 64 Ki
characters): they carry what clients send (a model name, captured messages), and every team's spans
travel in the same export requests, which a collector refuses whole past its size limit.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Mapping
from typing import Any

from sdk.observability.tracing.records import RequestTrace, SpanRecord

_KIND_INTERNAL, _KIND_CLIENT = 1, 3
_STATUS_ERROR = 2
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200  # SpanFlags: what the SDK sets on every span
VALUE_LIMIT = int(os.environ.get("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT")
                   or os.environ.get("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT") or 64 * 1024)
_FIXED64 = struct.Struct("<Q")
_DOUBLE = struct.Struct("<d")


class Encoded:
    """An encoded export request, in the shape the SDK's OTLP exporter asks of `encode_spans(...)`."""

    def __init__(self, data: bytes, spans: int):
        self.data = data
        self.spans = spans

    def __len__(self) -> int:  # the exporter counts spans with len()
        return self.spans

    def SerializePartialToString(self) -> bytes:
        return self.data


_ONE_BYTE = [bytes((i,)) for i in range(0x80)]


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    if 0 <= value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    if value < 0:
        value += 1 << 64  # int64 as two's complement, ten bytes
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_TAGS = [_varint(number << 3 | 2) for number in range(17)]  # length-delimited field tags, by field number


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    size = len(payload)
    return _TAGS[number] + (_ONE_BYTE[size] if size < 0x80 else _varint(size)) + payload


def _value(value: Any) -> bytes:
    """An AnyValue."""
    if isinstance(value, bool):
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, str):
        return _field(1, value[:VALUE_LIMIT].encode())
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return _field(7, value)
    if isinstance(value, tuple | list):
        return _field(5, b"".join(_field(1, _value(item)) for item in value))
    raise TypeError(f"attribute value of type {type(value).__name__} cannot be exported")


_KEYS: dict[str, bytes] = {}  # each attribute key's encoded field; the keys are Slipstream's own, a small set


def _key(key: str) -> bytes:
    encoded = _KEYS.get(key)
    if encoded is None:
        encoded = _field(1, key.encode())
        if len(_KEYS) < 4096:
            _KEYS[key] = encoded
    return encoded


def _attributes(number: int, attributes: Mapping[str, Any]) -> bytes:
    return b"".join(_field(number, _key(key) + _field(2, _value(value))) for key, value in attributes.items())


def _span(record: SpanRecord, trace_id: bytes, state: bytes, parent: int, remote_parent: bool) -> bytes:
    out = [_field(1, trace_id), _field(2, record.span_id.to_bytes(8, "big"))]
    if state:
        out.append(_field(3, state))
    if parent:
        out.append(_field(4, parent.to_bytes(8, "big")))
    out += [_field(5, record.name[:VALUE_LIMIT].encode()), b"\x30" + _varint(_KIND_CLIENT if record.client else _KIND_INTERNAL),
            b"\x39" + _FIXED64.pack(record.start_ns), b"\x41" + _FIXED64.pack(record.end_ns), _attributes(9, record.attributes)]
    for name, at, attributes in record.events:
        out.append(_field(11, b"\x09" + _FIXED64.pack(at) + _field(2, name.encode()) + _attributes(3, attributes)))
    status = (_field(2, record.error.encode()) + b"\x18" + _varint(_STATUS_ERROR)) if record.error else b""
    out.append(_field(15, status))
    out.append(b"\x85\x01" + struct.pack("<I", _HAS_IS_REMOTE | (_IS_REMOTE if remote_parent else 0)))  # field 16, fixed32
    return b"".join(out)


def trace_spans(trace: RequestTrace) -> list[bytes]:
    """A trace's spans, each encoded as one field of a ScopeSpans (children first, then the root)."""
    trace_id = trace.trace_id.to_bytes(16, "big")
    parent = trace.parent
    state = parent.tracestate.encode() if parent is not None and parent.tracestate else b""
    root = trace.root
    spans = [_field(2, _span(record, trace_id, state, root.span_id, False)) for record in trace.children]
    up, remote = (parent.span_id, parent.remote) if parent is not None else (0, False)
    spans.append(_field(2, _span(root, trace_id, state, up, remote)))
    return spans


def encode(traces: Iterable[RequestTrace], resource: Mapping[str, Any], scope: str) -> Encoded:
    """One ExportTraceServiceRequest: every span of `traces` under one resource and scope."""
    return request([span for trace in traces for span in trace_spans(trace)], resource, scope)


def request(spans: list[bytes], resource: Mapping[str, Any], scope: str) -> Encoded:
    """One ExportTraceServiceRequest of spans encoded by `trace_spans`, under one resource and scope."""
    scope_spans = _field(1, _field(1, scope.encode())) + b"".join(spans)
    resource_spans = _field(1, _attributes(1, resource)) + _field(2, scope_spans)
    return Encoded(_field(1, resource_spans), len(spans))
