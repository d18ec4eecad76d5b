"""What OpenTelemetry tracing adds to a request: off (no OTLP endpoint) against on (BatchSpanProcessor).

Two measurements in one run, tracing off and on interleaved in blocks so drift hits both alike:
1. end to end: a team's pipeline (TeamRuntime, every default stage) sending non-streamed and
   streamed requests to the emulator on loopback (in this process), p50 latency per request with
   tracing off; on with the SDK's BatchSpanProcessor in this process (the drop-in SDK's default,
   dropping exporter); on with the export process, as `slipstream serve` runs it (real encoding and
   OTLP export to bench/otlp_sink.py); and off again (the A/A difference says how much is noise);
2. the hooks alone: the tracing calls a request makes (request span, one stage span, attempt span
   with its traceparent, both ends), off and on, p50 per request over many rounds, and apart the
   work the last of them hands to the event loop for after the answer (building the spans).
"On" uses the SDK's BatchSpanProcessor with an exporter that drops the batches, so encoding and
sending (the exporter's, on its thread or, in `slipstream serve`, in the export process) are not in
these numbers: bench/proxy_overhead.py --traced measures them with the real OTLP exporter. A third
line times the OTLP encoding alone, per span: the SDK's encoder against Slipstream's.

    .venv/bin/python bench/tracing_overhead.py [--requests 600] [--rounds 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult  # noqa: E402

from emulator.testing import running_emulator  # noqa: E402
from sdk.observability import tracing  # noqa: E402
from sdk.observability.tracing.emit import Sink  # noqa: E402
from sdk.observability.tracing.export_process import ProcessSink  # noqa: E402
from sdk.pipeline import RequestContext  # noqa: E402
from sdk.policy import load_policy  # noqa: E402
from sdk.runtime import TeamRuntime  # noqa: E402
from sdk.types import Endpoint, LLMRequest, LLMResponse, Usage  # noqa: E402

BODY = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Say hello in one short sentence."}], "max_tokens": 16}


class DroppingExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def traced_processor() -> BatchSpanProcessor:
    return BatchSpanProcessor(DroppingExporter())


async def one_request(runtime: TeamRuntime, stream: bool) -> float:
    started = time.perf_counter()
    answer, _ = await runtime.handle(LLMRequest(Endpoint.CHAT_COMPLETIONS, {**BODY, "stream": stream}))
    if not isinstance(answer, LLMResponse):
        try:
            async for _ in answer.events:
                pass
        finally:
            await answer.aclose()
    return time.perf_counter() - started


async def end_to_end(runtime: TeamRuntime, sinks: list[Sink | ProcessSink | None], requests: int, stream: bool) -> list[float]:
    """p50 seconds per request for each of `sinks` (None: tracing off), in rotating blocks of 20 (drift
    hits all alike); the caller puts None last again as an A/A control of the noise floor."""
    times: list[list[float]] = [[] for _ in sinks]
    for _ in range(20):  # warm the pool and the caches of every path
        await one_request(runtime, stream)
    for block in range(requests // 20):
        group = block % len(sinks)
        tracing.use_sink(sinks[group])
        for _ in range(20):
            times[group].append(await one_request(runtime, stream))
    tracing.use_sink(None)
    return [statistics.median(group) for group in times]


def otlp_sink_process() -> tuple[subprocess.Popen[bytes], str]:
    """bench/otlp_sink.py on a free port: the export process's collector."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, str(ROOT / "bench" / "otlp_sink.py"), str(port)])
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(f"{url}/stats", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    return process, url


async def hooks(processor: BatchSpanProcessor, rounds: int) -> dict[bool, tuple[float, float]]:
    """Per request, off and on: p50 µs of the tracing calls on the request path (request span, a stage
    span, attempt span with its traceparent, both ends), and of the work handed over to the loop after
    the answer (result attributes, spans built and given to the processor), measured around the
    loop turn that runs it, less that turn's cost with tracing off."""
    request = LLMRequest(Endpoint.CHAT_COMPLETIONS, dict(BODY))
    answer = LLMResponse(200, b'{"id":"c1","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"finish_reason":"stop"}]}',
                         {}, Usage(12, 8), "gpt/gpt-4o")
    clock = time.perf_counter
    results = {}
    for on in (False, True):
        tracing.install(processor if on else None)
        path, after = [], []
        for _ in range(rounds):
            ctx = RequestContext(request, "bench")
            started = clock()
            trace = tracing.begin(ctx)
            if trace is not None:
                trace.stage("prompt_cache plan", time.time_ns(), {"slipstream.prompt_cache.expected_read": 0})
            span, _ = tracing.begin_attempt(ctx, "gpt/gpt-4o", None, request)
            tracing.end_attempt(span, "ok")
            tracing.end(ctx, 200, answer)
            answered = clock()
            await asyncio.sleep(0)  # the loop turn after the answer: the handed-over work runs here
            path.append(answered - started)
            after.append(clock() - answered)
        results[on] = (statistics.median(path), statistics.median(after))
    tracing.install(None)
    return results


async def encoding(requests: int) -> tuple[float, float]:
    """µs per span to encode the spans of `requests` traced requests (made by the real hooks) for OTLP:
    the SDK's encoder (what its exporter does on the BatchSpanProcessor's thread) and Slipstream's
    (what the export process of `slipstream serve` does)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from sdk.observability.tracing.emit import Sink
    from sdk.observability.tracing.otlp_encoding import encode

    class Keep:
        def __init__(self) -> None:
            self.items: list[Any] = []

        def on_end(self, span) -> None:
            self.items.append(span)

        def emit(self, trace) -> None:
            self.items.append(trace)

    traces, spans = Keep(), Keep()
    request = LLMRequest(Endpoint.CHAT_COMPLETIONS, dict(BODY))
    answer = LLMResponse(200, b'{"id":"c1","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"finish_reason":"stop"}]}',
                         {}, Usage(12, 8), "gpt/gpt-4o")
    tracing.install(spans)
    tracing.use_sink(cast(Sink, traces))  # collect the records themselves (duck-typed: only `emit` is called)
    for _ in range(requests):
        ctx = RequestContext(request, "bench")
        trace = tracing.begin(ctx)
        assert trace is not None
        trace.stage("prompt_cache plan", time.time_ns(), {"slipstream.prompt_cache.expected_read": 0, "slipstream.prompt_cache.miss_cause": "none"})
        span, _ = tracing.begin_attempt(ctx, "gpt/gpt-4o", None, request)
        tracing.end_attempt(span, "ok")
        tracing.end(ctx, 200, answer)
    await asyncio.sleep(0)  # the traces are handed over on the loop's next turn
    tracing.install(None)
    sink = Sink(cast(SpanProcessor, spans), tracing.resource())  # duck-typed: only `on_end` is called
    for trace in traces.items:
        sink.emit(trace)
    count, attributes = len(spans.items), dict(sink.resource.attributes)
    sdk_s, ours_s = [], []
    for _ in range(5):  # the fastest of five passes each, alternating: the least disturbed by the machine
        started = time.perf_counter()
        encode_spans(spans.items).SerializePartialToString()
        sdk_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        encode(traces.items, attributes, "slipstream")
        ours_s.append(time.perf_counter() - started)
    return min(sdk_s) / count, min(ours_s) / count


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=20000)
    args = parser.parse_args()
    processor = traced_processor()
    measured = await hooks(processor, args.rounds)
    (off, turn_off), (on, turn_on) = measured[False], measured[True]
    print(f"hooks alone, p50 per request: on the request path off {off * 1e6:.2f} us, on {on * 1e6:.1f} us "
          f"(+{(on - off) * 1e6:.1f} us); after the answer (spans built, handed to the processor) +{(turn_on - turn_off) * 1e6:.1f} us")
    sdk_encoder, ours = await encoding(2000)
    print(f"OTLP encoding, per span: the SDK's encoder {sdk_encoder * 1e6:.1f} us, Slipstream's {ours * 1e6:.1f} us "
          f"(x{sdk_encoder / ours:.1f})")
    with running_emulator() as upstream, tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "bench.yaml"
        path.write_text(f"""team: bench
api_keys: [{{value: "sk-bench"}}]
providers:
  gpt: {{kind: openai, base_url: "{upstream.url}/v1", api_key: "up"}}
routes:
  - match: {{model: "gpt-*"}}
    targets: [{{provider: gpt}}]
""")
        runtime = TeamRuntime.build(load_policy(path))
        collector, url = otlp_sink_process()
        os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"{url}/v1/traces"  # read by the export process
        exported = ProcessSink()
        try:
            thread = Sink(processor, tracing.resource())
            for stream in (False, True):
                off, on, child, again = await end_to_end(runtime, [None, thread, exported, None], args.requests, stream)
                kind = "streamed" if stream else "complete"
                print(f"end to end, {kind}: p50 off {off * 1000:.3f} ms; on, in-process processor {on * 1000:.3f} ms "
                      f"({(on - off) * 1000:+.3f} ms); on, export process (as slipstream serve) {child * 1000:.3f} ms "
                      f"({(child - off) * 1000:+.3f} ms); off again {again * 1000:.3f} ms (A/A {(again - off) * 1000:+.3f} ms: the noise floor)")
        finally:
            exported.shutdown()
            print("OTLP sink received:", urllib.request.urlopen(f"{url}/stats", timeout=5).read().decode())
            collector.terminate()
            collector.wait()
    processor.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
