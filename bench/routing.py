"""Routing under faults: the official SDK's own retries against Slipstream with two targets, in one run.

An emulator subprocess answers streaming Anthropic requests (TTFT 200 ms, 32 tokens at 5 ms; with
`--ttft-jitter S` each TTFT is multiplied by a lognormal(0, S) factor, as real providers' vary); an ASGI
wrapper in front of it gives each upstream attempt, independently, a 20% chance of an error
(429 with retry-after 1 s, 529 or 500, one third each) and a 5% chance of a 5 s stall before the
first byte. Three passes of the same requests at the same concurrency:

1. fault-free: the official `anthropic` client straight to the emulator (the latency to beat);
2. faults, official SDK: `anthropic.AsyncAnthropic` (max_retries=2, its default) straight to it;
3. faults, Slipstream: the drop-in `sdk.AsyncAnthropic` with a policy of two targets, retries with
   short full-jitter backoff, a first-byte timeout and hedging.

Latency is end to end (request sent to the last event read). Upstream attempts come from the
emulator's own counter. Not a test; the numbers go in docs/routing.md and docs/benchmarks.md.

    .venv/bin/python bench/routing.py [--requests 1000] [--concurrency 32] [--ttft-jitter 0.3] [--keys 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MESSAGES = [{"role": "user", "content": "Say hello in one short sentence."}]
FAULTS = [(0.2 / 3, "429:retry_after=1"), (0.2 / 3, "529"), (0.2 / 3, "500"), (0.05, "stall:ms=5000")]
POLICY = """team: bench
providers:
  a: {{kind: anthropic, base_url: "{url}", api_key: {keys}}}
  b: {{kind: anthropic, base_url: "{url}", api_key: {keys}}}
routes:
  - match: {{model: "*"}}
    targets: [{{provider: a}}, {{provider: b}}]
retry: {{max_attempts: 4, base_delay_ms: 10, max_delay_ms: 1000, first_byte_timeout_ms: 1000, deadline_ms: 30000}}
hedging: {{enabled: true, min_samples: 20, default_delay_ms: 400, max_legs: 3}}
"""


def faulty_emulator_app(rate: float, jitter: float):
    """The emulator behind an ASGI wrapper that sets x-emulator-fault at random on `rate` of attempts."""
    from emulator.app import EmulatorConfig, create_app

    app = create_app(EmulatorConfig.realistic(ttft_base_ms=200, ttft_jitter=jitter, per_output_token_ms=5,
                                              default_output_tokens=32))

    async def wrapped(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/v1/messages" and rate > 0:
            roll, spec = random.random(), None
            for share, fault in FAULTS:
                if roll < share:
                    spec = fault
                    break
                roll -= share
            if spec:
                scope = {**scope, "headers": [*scope["headers"], (b"x-emulator-fault", spec.encode())]}
        await app(scope, receive, send)

    return wrapped


def serve_emulator(port: int, rate: float, jitter: float) -> None:
    import uvicorn

    uvicorn.run(faulty_emulator_app(rate, jitter), host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                log_level="warning", access_log=False, lifespan="off")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]  # an AF_INET address: (host, port)
        return port


def start_emulator(rate: float, jitter: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve-emulator", str(port), "--fault-rate", str(rate),
                             "--ttft-jitter", str(jitter)],
                            cwd=ROOT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/_emulator/stats", timeout=1)
            return proc, url
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("emulator did not start") from None
            time.sleep(0.1)


def upstream_requests(url: str) -> int:
    import json

    stats: dict[str, int] = json.load(urllib.request.urlopen(f"{url}/_emulator/stats"))
    return stats["requests_total"]


@dataclass
class Result:
    name: str
    ok: int
    total: int
    latencies: list[float]
    attempts: int

    def row(self, baseline_p99: float | None) -> str:
        ordered = sorted(self.latencies) or [float("nan")]
        p50 = ordered[len(ordered) // 2] * 1000
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000
        ratio = f"{p99 / baseline_p99:.2f}x" if baseline_p99 else "-"
        return (f"{self.name:<34} {100 * self.ok / self.total:8.2f}% {p50:9.0f} {p99:9.0f} {ratio:>9} "
                f"{self.attempts / self.total:10.2f}")


async def run_pass(name: str, client, url: str, requests: int, concurrency: int) -> Result:
    before = upstream_requests(url)
    latencies: list[float] = []
    ok = 0
    queue = iter(range(requests))

    async def worker() -> None:
        nonlocal ok
        for _ in queue:
            started = time.perf_counter()
            try:
                async with client.messages.stream(model="claude-bench", max_tokens=64, messages=MESSAGES) as stream:
                    message = await stream.get_final_message()
                if message.stop_reason and message.content:
                    ok += 1
                    latencies.append(time.perf_counter() - started)
            except Exception as exc:
                kind = f"{type(exc).__name__}: {str(exc)[-100:]}"
                failures[kind] = failures.get(kind, 0) + 1

    failures: dict[str, int] = {}
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    if failures:
        print(f"{name}: failures {failures}")
    return Result(name, ok, requests, latencies, upstream_requests(url) - before)


async def main(args: argparse.Namespace) -> None:
    import anthropic

    import sdk
    from sdk.providers.upstream import close_upstream_for_running_loop

    clean, clean_url = start_emulator(0.0, args.ttft_jitter)
    faulty, faulty_url = start_emulator(0.25, args.ttft_jitter)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            policy = Path(tmp) / "bench.yaml"
            keys = "[" + ", ".join(f"up-{i}" for i in range(args.keys)) + "]"
            policy.write_text(POLICY.format(url=faulty_url, keys=keys))
            passes = [
                ("fault-free, official SDK", anthropic.AsyncAnthropic(base_url=clean_url, api_key="up"), clean_url),
                ("faults, official SDK (2 retries)", anthropic.AsyncAnthropic(base_url=faulty_url, api_key="up"), faulty_url),
                ("faults, Slipstream (2 targets)", sdk.AsyncAnthropic(policy=policy, max_retries=0), faulty_url),
            ]
            results = []
            for name, client, url in passes:
                # Warm-up, not counted: connection pools, and for Slipstream a window of steady-state
                # time-to-first-byte samples (the hedge delay is their p95; a cold start's first
                # concurrent burst is slower and would set it for the first few hundred requests).
                await run_pass(name, client, url, min(args.warmup, args.requests), args.concurrency)
                results.append(await run_pass(name, client, url, args.requests, args.concurrency))
        await close_upstream_for_running_loop()
    finally:
        for proc in (clean, faulty):
            os.killpg(proc.pid, signal.SIGTERM)
    baseline = sorted(results[0].latencies)[int(len(results[0].latencies) * 0.99)] * 1000
    print(f"{args.requests} streaming requests at concurrency {args.concurrency}; TTFT 200 ms x lognormal(0, "
          f"{args.ttft_jitter}); faults per upstream attempt: 20% 429/529/500, 5% 5 s stall; "
          f"{args.keys} key(s) per Slipstream target")
    print(f"{'pass':<34} {'success':>9} {'p50 ms':>9} {'p99 ms':>9} {'p99/base':>9} {'attempts/req':>10}")
    for result in results:
        print(result.row(baseline))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=1000, help="requests run before each pass, not counted")
    parser.add_argument("--keys", type=int, default=1, help="API keys per Slipstream target (a 429 moves to the next)")
    parser.add_argument("--ttft-jitter", type=float, default=0.0,
                        help="sigma of the emulator's lognormal TTFT factor (0: every TTFT is 200 ms)")
    parser.add_argument("--serve-emulator", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--fault-rate", type=float, default=0.0, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.serve_emulator:
        serve_emulator(arguments.serve_emulator, arguments.fault_rate, arguments.ttft_jitter)
    else:
        import uvloop

        uvloop.run(main(arguments))
