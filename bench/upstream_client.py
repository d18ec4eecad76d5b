"""The upstream client alone against a plain stdlib `http.server` upstream (bench/slow_upstream.py).

Where the proxy's added latency depends on the upstream: p50 of one call at concurrency 1 with
aiohttp (the baseline, as an ordinary client sees the upstream), with httpx (the library a
proxy-capable client could have been built on: what the official clients use), and with
Slipstream's client (sdk/providers/http1.py, http1_wire.py) as it is, without its immediate ACK (`TCP_QUICKACK`),
and without its spare connection for upstreams that close after each answer. Variants alternate in blocks so machine
noise hits all alike. Three upstream modes: HTTP/1.0 (BaseHTTPRequestHandler's default: a new
connection per call), HTTP/1.1 keep-alive with Nagle on (head and body in two sends), and HTTP/1.1
with TCP_NODELAY.

    .venv/bin/python bench/upstream_client.py [--requests 480] [--delay-ms 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpx
import uvloop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.proxy_overhead import PY, free_port, start, stop, wait_ready  # noqa: E402
from sdk.providers import http1, http1_wire  # noqa: E402
from sdk.providers.upstream import Timeouts  # noqa: E402

BODY = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}).encode()
HEADERS = {"content-type": "application/json", "authorization": "Bearer up"}
QUICKACK = http1_wire._QUICKACK
SPARE = http1.Http1Upstream._spare


async def _no_spare(self: http1.Http1Upstream, origin: object, pool: object) -> None:
    return None


def _configure(quickack: bool, spare: bool) -> None:
    http1_wire._QUICKACK = QUICKACK if quickack else None
    http1.Http1Upstream._spare = SPARE if spare else _no_spare  # type: ignore[method-assign]


async def measure(url: str, n: int, blocks: int = 8) -> dict[str, float]:
    variants: dict[str, tuple[bool, bool] | None] = {
        "aiohttp": None, "httpx": None, "slipstream": (True, True), "no quickack": (False, True), "no spare": (True, False)}
    times: dict[str, list[float]] = {name: [] for name in variants}
    async with aiohttp.ClientSession() as session, httpx.AsyncClient(trust_env=False) as library:
        for _ in range(blocks):
            for name, config in variants.items():
                call: Callable[[], Awaitable[object]]
                client = None
                if name == "aiohttp":
                    async def call() -> object:
                        async with session.post(url, data=BODY, headers=HEADERS) as response:
                            return await response.read()
                elif name == "httpx":
                    async def call() -> object:
                        return (await library.post(url, content=BODY, headers=HEADERS)).content
                else:
                    assert config is not None
                    _configure(*config)
                    pool = client = http1.Http1Upstream()

                    async def call(pool: http1.Http1Upstream = pool) -> object:
                        return await (await pool.post(url, HEADERS, BODY, Timeouts())).read()
                for _ in range(5):
                    await call()
                for _ in range(n // blocks):
                    started = time.perf_counter()
                    await call()
                    times[name].append(time.perf_counter() - started)
                if client is not None:
                    await client.aclose()
    _configure(True, True)
    return {name: statistics.median(values) * 1000 for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=480)
    parser.add_argument("--delay-ms", type=float, default=5.0)
    args = parser.parse_args()
    uvloop.install()
    print(f"load average before: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print("| upstream | aiohttp p50 ms | httpx p50 ms | slipstream p50 ms | without quickack | without spare connection |")
    print("|---|---|---|---|---|---|")
    for label, flags in (("HTTP/1.0 (stdlib default)", []), ("HTTP/1.1, Nagle on", ["--http11"]),
                         ("HTTP/1.1, TCP_NODELAY", ["--http11", "--nodelay"])):
        port = free_port()
        proc = start([PY, str(ROOT / "bench" / "slow_upstream.py"), str(port), "--delay-ms", str(args.delay_ms), *flags])
        try:
            wait_ready(f"http://127.0.0.1:{port}/")
            got = asyncio.run(measure(f"http://127.0.0.1:{port}/v1/chat/completions", args.requests))
        finally:
            stop(proc)
        print(f"| {label} | {got['aiohttp']:.2f} | {got['httpx']:.2f} | {got['slipstream']:.2f} | {got['no quickack']:.2f} "
              f"| {got['no spare']:.2f} |", flush=True)
    print(f"load average after: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
