"""Span export in a child process: the serving process only pickles finished traces down a pipe.

Encoding spans for OTLP costs far more than recording them (the SDK's encoder: about 120 µs a
span on the 2-core benchmark machine, against a few µs to record one: docs/benchmark-history.md). On the BatchSpanProcessor's worker thread that work holds the interpreter lock and the
event loop waits for it: a proxy at 64 concurrent requests lost half its throughput. Here a writer
thread pickles each batch of finished traces (~10 µs a request) onto the stdin of a child process
(`python -m sdk.observability.tracing.export_process`), which encodes them (sdk/observability/tracing/otlp_encoding.py) and
sends them with the SDK's OTLP HTTP exporter, configured by the same `OTEL_*` variables it inherits.

The writer wakes only when traces are waiting, a quarter second after the first of a batch (at a
few requests a second the proxy is not woken for nothing). Backpressure drops, never blocks: past
`MAX_PENDING` traces waiting, a new one is dropped and counted (one warning) unless its team holds
less than its share (`MAX_PENDING` over the teams waiting), up to twice `MAX_PENDING` in all
(sdk/shares.py), so one
team whose traffic outruns the collector does not have every other team's traces dropped with its own. The child exits when its stdin closes: at the parent's exit (flushing what
it holds) or when the parent dies.
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sdk
from sdk.observability.tracing.otlp_encoding import Encoded, request, trace_spans
from sdk.observability.tracing.records import RequestTrace
from sdk.shares import FairShares

log = logging.getLogger("slipstream.tracing")

MAX_PENDING = 20_000  # traces waiting for the writer; more are dropped
GATHER_S = 0.25  # the writer sends what gathered this long after the first trace: few wake-ups, small frames
FRAME_TRACES = 256  # traces per pickled frame, so one pickling never holds the interpreter lock for long
# Most span bytes in one export request: a collector refuses a larger one whole (gRPC's default
# 4 MiB, the least common limit), and with it every other team's spans sent beside one team's large ones.
EXPORT_BYTES = 4 * 1024 * 1024 - 64 * 1024


class ProcessSink:
    """Hands finished traces to the export child; `emit` is a list append on the event loop's thread."""

    def __init__(self) -> None:
        root = str(Path(sdk.__file__).resolve().parents[1])  # where `sdk` is importable from
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
        self._child = subprocess.Popen([sys.executable, "-m", "sdk.observability.tracing.export_process"], stdin=subprocess.PIPE, env=env)
        self._pending: list[RequestTrace] = []
        self._shares = FairShares(MAX_PENDING)  # each team's places in `_pending`
        self._dropped = 0
        self._wake = threading.Event()  # set when the first trace of a batch arrives (or at shutdown)
        self._stop = threading.Event()
        self._writer = threading.Thread(target=self._write, name="slipstream-trace-export", daemon=True)
        self._writer.start()
        atexit.register(self.shutdown)

    def emit(self, trace: RequestTrace) -> None:
        pending = self._pending
        if self._stop.is_set() or not self._shares.take(str(trace.root.attributes.get("slipstream.team", ""))):
            self._dropped += 1
            if self._dropped == 1:
                log.warning("the trace export process is not keeping up (or is gone): dropping traces")
            return
        pending.append(trace)
        if len(pending) == 1:
            self._wake.set()

    def _write(self) -> None:
        pipe = self._child.stdin
        assert pipe is not None
        while True:
            self._wake.wait()
            self._stop.wait(GATHER_S)  # let a batch gather (shutdown cuts it short)
            self._wake.clear()
            batch, self._pending, self._shares = self._pending, [], FairShares(MAX_PENDING)  # the loop thread appends to whichever list is current
            try:
                for start in range(0, len(batch), FRAME_TRACES):
                    frame = pickle.dumps(batch[start:start + FRAME_TRACES], protocol=pickle.HIGHEST_PROTOCOL)
                    pipe.write(len(frame).to_bytes(4, "big") + frame)
                pipe.flush()
            except OSError as exc:  # the child is gone: nothing more can be exported
                log.warning("the trace export process stopped (%s); tracing drops spans from now on", exc)
                self._stop.set()
                return
            if self._stop.is_set():
                return

    def shutdown(self) -> None:
        """Flush what is pending, close the pipe and let the child export the rest (bounded wait)."""
        if self._child.poll() is not None and self._stop.is_set():
            return
        self._stop.set()
        self._wake.set()
        self._writer.join(timeout=5)
        try:
            if self._child.stdin is not None:
                self._child.stdin.close()
            self._child.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self._child.kill()


def _read(fd: int, size: int) -> bytes:
    """Exactly `size` bytes from a pipe (b"" once it is closed): reads on pipes may come back short."""
    data = b""
    while len(data) < size:
        piece = os.read(fd, size - len(data))
        if not piece:
            return b""
        data += piece
    return data


def _frames(fd: int, timeout_s: float) -> Iterator[list[RequestTrace] | None]:
    """Each frame's traces as it arrives, None after `timeout_s` without one; ends when the pipe closes.
    Unbuffered reads on the descriptor, so `select` never misses bytes a buffer already holds."""
    while True:
        if not select.select([fd], [], [], timeout_s)[0]:
            yield None
            continue
        header = _read(fd, 4)
        if not header:
            return
        yield pickle.loads(_read(fd, int.from_bytes(header, "big")))


def _exporter() -> Any:
    """The SDK's OTLP HTTP exporter (it reads every `OTEL_EXPORTER_OTLP_*` variable), taking requests
    encoded by sdk/observability/tracing/otlp_encoding.py: its module-level `encode_spans` passes those through.
    Patched in this process only, which exists for this exporter alone."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode
    from opentelemetry.exporter.otlp.proto.http import trace_exporter

    def encode_spans(spans: Any) -> Any:
        return spans if isinstance(spans, Encoded) else sdk_encode(spans)

    # The exporter calls the name it imported into its own namespace (not one it exports), so the
    # patch replaces it there; it widens what the name takes: see the docstring.
    vars(trace_exporter)["encode_spans"] = encode_spans
    return trace_exporter.OTLPSpanExporter()


def main() -> None:
    """The child: traces from stdin, encoded and exported in batches like the SDK's BatchSpanProcessor
    would (`OTEL_BSP_SCHEDULE_DELAY` ms, `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` spans, and at most
    `EXPORT_BYTES` of spans unless one trace alone is more), until stdin closes."""
    from sdk.observability.tracing.setup import resource

    # Ctrl-C or a SIGTERM to the proxy's process group reaches this child too: it ends when its stdin
    # closes instead (the proxy's exit or death), after sending what it holds, without a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    exporter = _exporter()
    attributes = dict(resource().attributes)
    delay_s = float(os.environ.get("OTEL_BSP_SCHEDULE_DELAY", "5000")) / 1000
    batch_size = int(os.environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512"))
    held: list[bytes] = []  # encoded spans
    size = 0
    due = time.monotonic() + delay_s

    def flush() -> None:
        nonlocal held, size
        if held:
            exporter.export(request(held, attributes, "slipstream"))  # failures are the exporter's to log
        held, size = [], 0

    try:
        for traces in _frames(sys.stdin.fileno(), delay_s):
            for trace in traces or ():
                spans = trace_spans(trace)
                more = sum(map(len, spans))
                if size + more > EXPORT_BYTES:
                    flush()
                held += spans
                size += more
            if len(held) >= batch_size or time.monotonic() >= due:
                flush()
                due = time.monotonic() + delay_s
    finally:
        flush()
        exporter.shutdown()


if __name__ == "__main__":
    main()
