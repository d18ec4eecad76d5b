"""What OpenTelemetry tracing adds to a request: off (no OTLP endpoint) against on (BatchSpanProcessor).

Two measurements in one run, tracing off and on interleaved in blocks so drift hits both alike:
1. end to end: a team's pipeline (TeamRuntime, every default stage) sending non-streamed and
   streamed requests to the emulator on loopback, p50 latency per request with tracing off and on;
2. the hooks alone: the tracing calls a request makes (request span, one stage span, attempt span
   with its traceparent, both ends, the hand-over to the processor), off and on, p50 of the
   per-request cost over many rounds.
"On" uses the SDK's BatchSpanProcessor with an exporter that drops the batches, so the export
itself (a background thread) stays out of the request path, as it does with OTLP.

    .venv/bin/python bench/tracing_overhead.py [--requests 600] [--rounds 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult  # noqa: E402

from emulator.testing import running_emulator  # noqa: E402
from sdk import tracing  # noqa: E402
from sdk.pipeline import RequestContext  # noqa: E402
from sdk.policy import load_policy  # noqa: E402
from sdk.runtime import TeamRuntime  # noqa: E402
from sdk.types import Endpoint, LLMRequest, LLMResponse, Usage  # noqa: E402

BODY = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Say hello in one short sentence."}], "max_tokens": 16}


class DroppingExporter(SpanExporter):
    def export(self, spans: Sequence) -> SpanExportResult:
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


async def end_to_end(runtime: TeamRuntime, processor: BatchSpanProcessor, requests: int, stream: bool) -> tuple[float, float]:
    """p50 seconds per request with tracing off and on, in alternating blocks of 20."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(20):  # warm the pool and the caches of both paths
        await one_request(runtime, stream)
    for block in range(requests // 20):
        on = block % 2 == 1
        tracing.install(processor if on else None)
        for _ in range(20):
            times[on].append(await one_request(runtime, stream))
    tracing.install(None)
    return statistics.median(times[False]), statistics.median(times[True])


def hooks(processor: BatchSpanProcessor, rounds: int) -> tuple[float, float]:
    """p50 seconds of one request's tracing calls, off and on (in batches of 100 calls)."""
    request = LLMRequest(Endpoint.CHAT_COMPLETIONS, dict(BODY))
    answer = LLMResponse(200, b'{"model":"gpt-4o","choices":[{"finish_reason":"stop"}]}', {}, Usage(12, 8), "gpt/gpt-4o")
    results = []
    for on in (False, True):
        tracing.install(processor if on else None)
        batches = []
        for _ in range(rounds // 100):
            started = time.perf_counter()
            for _ in range(100):
                ctx = RequestContext(request, "bench")
                trace = tracing.begin(ctx)
                if trace is not None:
                    trace.stage("prompt_cache plan", time.time_ns(), {"slipstream.prompt_cache.expected_read": 0})
                span, sent = tracing.begin_attempt(ctx, "gpt/gpt-4o", None, request)
                tracing.end_attempt(span, "ok")
                tracing.end(ctx, 200, answer)
            batches.append((time.perf_counter() - started) / 100)
        results.append(statistics.median(batches))
    tracing.install(None)
    return results[0], results[1]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=20000)
    args = parser.parse_args()
    processor = traced_processor()
    off, on = hooks(processor, args.rounds)
    print(f"hooks alone: off {off * 1e6:.2f} us, on {on * 1e6:.1f} us per request (+{(on - off) * 1e6:.1f} us)")
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
        for stream in (False, True):
            off, on = await end_to_end(runtime, processor, args.requests, stream)
            kind = "streamed" if stream else "complete"
            print(f"end to end, {kind}: p50 off {off * 1000:.3f} ms, on {on * 1000:.3f} ms "
                  f"(+{(on - off) * 1000:.3f} ms, x{on / off:.3f})")
    processor.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
