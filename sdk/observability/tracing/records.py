"""What a traced request writes down while it runs: plain objects, no OpenTelemetry.

A request being traced carries one `RequestTrace` (`RequestContext.trace`): its own span and one
record per child (a stage that did work, an upstream attempt). Each record is a name, an id, two
wall-clock times and a dict of attributes; they become OpenTelemetry spans only when the request
ends (sdk/observability/tracing/emit.py), in one pass. Writing them down costs a few dict and list operations,
so a stage can afford a span of its own.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

_HEX = frozenset("0123456789abcdef")
MAX_TRACESTATE = 512  # characters of a client's tracestate kept: what W3C Trace Context asks vendors to carry


def new_span_id() -> int:
    """A random non-zero 64-bit span id (W3C trace context)."""
    return random.getrandbits(64) or 1


def new_trace_id() -> int:
    return random.getrandbits(128) or 1


@dataclass(slots=True)
class SpanRecord:
    name: str
    span_id: int
    start_ns: int  # wall clock (time.time_ns), as OpenTelemetry wants it
    attributes: dict[str, Any]
    client: bool = False  # an upstream call (span kind CLIENT); else INTERNAL
    end_ns: int = 0
    error: str = ""  # the status description when it failed
    events: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)

    def finish(self, attributes: dict[str, Any] | None = None, error: str = "") -> None:
        if attributes:
            self.attributes.update(attributes)
        self.error = error
        self.end_ns = time.time_ns()


@dataclass(slots=True)
class Parent:
    """The span a request's span belongs under: the client's `traceparent`, or the caller's own span
    when the drop-in SDK runs the pipeline in the application's process."""

    trace_id: int
    span_id: int
    flags: int = 1  # bit 0: sampled
    tracestate: str = ""
    remote: bool = True  # came over the wire


@dataclass(slots=True)
class RequestTrace:
    trace_id: int
    root: SpanRecord
    parent: Parent | None = None
    children: list[SpanRecord] = field(default_factory=list)

    @property
    def flags(self) -> int:
        return self.parent.flags | 1 if self.parent is not None else 1  # recorded means sampled

    def child(self, name: str, start_ns: int, attributes: dict[str, Any], client: bool = False) -> SpanRecord:
        """A child span, open until `finish` (an upstream attempt)."""
        record = SpanRecord(name, new_span_id(), start_ns, attributes, client)
        self.children.append(record)
        return record

    def stage(self, name: str, start_ns: int, attributes: dict[str, Any]) -> None:
        """A child span that ends now: a stage's own work, from `start_ns` (time.time_ns) to here."""
        self.children.append(SpanRecord(name, new_span_id(), start_ns, attributes, end_ns=time.time_ns()))

    def traceparent(self, record: SpanRecord) -> str:
        """The W3C `traceparent` that makes `record` the parent of what the upstream does."""
        return f"00-{self.trace_id:032x}-{record.span_id:016x}-{self.flags:02x}"


def parse_traceparent(value: str, tracestate: str = "") -> Parent | None:
    """A W3C `traceparent` header (version 00 layout; later versions are read the same way), or None
    when it is malformed or names the all-zero ids, which the spec says to ignore. A `tracestate`
    over MAX_TRACESTATE characters is dropped: it is a client's header (up to 64 KiB), held by every
    span of the trace while it waits for export, and sent upstream."""
    parts = value.strip().lower().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff" or (parts[0] == "00" and len(parts) != 4):
        return None
    version, trace, span, flags = parts[:4]
    if len(trace) != 32 or len(span) != 16 or len(flags) != 2 or not _HEX.issuperset(version + trace + span + flags):
        return None
    trace_id, span_id = int(trace, 16), int(span, 16)
    if not trace_id or not span_id:
        return None
    return Parent(trace_id, span_id, int(flags, 16), tracestate if len(tracestate) <= MAX_TRACESTATE else "")
