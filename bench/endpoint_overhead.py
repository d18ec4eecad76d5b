"""Proxy overhead per endpoint, against two upstreams, measured from the client with two clients.

Endpoints: chat completions, embeddings, Responses native (to an OpenAI-kind upstream) and Responses
translated (to an Anthropic-kind upstream: the direct baseline is the same upstream's /v1/messages).
Upstreams: the emulator (asyncio, keep-alive) and bench/slow_upstream.py (stdlib `http.server`,
thread per connection, HTTP/1.0, answers after 5 ms), both as separate processes, like the proxy.
Clients: the bench's own (aiohttp) and an ordinary `httpx.AsyncClient`. For each (upstream,
endpoint, client): p50 added at concurrency 1 (direct and proxied blocks interleaved so machine
noise hits both alike), the proxy's own `x-slipstream-overhead-ms` p50, and req/s at concurrency 64
(bench client only). The embedding cache is off in the bench policy: every request goes upstream.

    .venv/bin/python bench/endpoint_overhead.py [--requests 400] [--seconds 5] [--upstreams emulator,slow]
        [--endpoints chat,embeddings,responses,responses-translated] [--clients aiohttp,httpx]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
import uvloop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.proxy_overhead import PY, emulator_process, free_port, start, stop, wait_ready  # noqa: E402

KEY = "sk-bench"
HELLO = "Say hello in one short sentence."
# endpoint -> (proxied path, direct path, body, anthropic headers for the direct call)
ENDPOINTS: dict[str, tuple[str, str, dict[str, object], bool]] = {
    "chat": ("/v1/chat/completions", "/v1/chat/completions",
             {"model": "gpt-4o", "messages": [{"role": "user", "content": HELLO}], "max_tokens": 16}, False),
    "embeddings": ("/v1/embeddings", "/v1/embeddings", {"model": "text-embedding-3-small", "input": HELLO}, False),
    "responses": ("/v1/responses", "/v1/responses", {"model": "gpt-4o", "input": HELLO, "max_output_tokens": 16}, False),
    "responses-translated": ("/v1/responses", "/v1/messages",
                             {"model": "claude-sonnet-4-6", "input": HELLO, "max_output_tokens": 16}, True),
}
DIRECT_TRANSLATED = {"model": "claude-sonnet-4-6", "max_tokens": 16, "messages": [{"role": "user", "content": HELLO}]}


@dataclass
class Call:
    url: str
    body: bytes
    headers: dict[str, str]


Send = Callable[[Call], Awaitable[float | None]]  # -> the proxy's overhead header (ms), when present


def aiohttp_sender(session: aiohttp.ClientSession) -> Send:
    async def send(call: Call) -> float | None:
        async with session.post(call.url, data=call.body, headers=call.headers) as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(f"{call.url}: {response.status} {await response.text()}")
            overhead = response.headers.get("x-slipstream-overhead-ms")
            return float(overhead) if overhead else None

    return send


def httpx_sender(client: httpx.AsyncClient) -> Send:
    async def send(call: Call) -> float | None:
        response = await client.post(call.url, content=call.body, headers=call.headers)
        if response.status_code != 200:
            raise RuntimeError(f"{call.url}: {response.status_code} {response.text}")
        overhead = response.headers.get("x-slipstream-overhead-ms")
        return float(overhead) if overhead else None

    return send


async def timed(send: Send, call: Call, n: int) -> tuple[list[float], list[float]]:
    times, overheads = [], []
    for _ in range(n):
        started = time.perf_counter()
        overhead = await send(call)
        times.append(time.perf_counter() - started)
        if overhead is not None:
            overheads.append(overhead)
    return times, overheads


async def concurrency_one(client: str, direct: Call, via: Call, n: int, rounds: int = 4) -> dict[str, float]:
    """p50s of alternating blocks of direct and proxied calls over one kept-alive client."""
    base: list[float] = []
    proxied: list[float] = []
    header: list[float] = []
    async with _client(client) as send:
        for call in (direct, via):
            await timed(send, call, 20)  # warm connections, pools, caches
        for _ in range(rounds):
            base += (await timed(send, direct, n // rounds))[0]
            got, overheads = await timed(send, via, n // rounds)
            proxied += got
            header += overheads
    direct_p50, proxied_p50 = statistics.median(base) * 1000, statistics.median(proxied) * 1000
    return {"direct_p50_ms": direct_p50, "proxied_p50_ms": proxied_p50, "added_p50_ms": proxied_p50 - direct_p50,
            "header_p50_ms": statistics.median(header) if header else float("nan")}


class _client:
    def __init__(self, kind: str, concurrency: int = 1):
        self.kind, self.concurrency = kind, concurrency

    async def __aenter__(self) -> Send:
        if self.kind == "aiohttp":
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self.concurrency))
            return aiohttp_sender(self._session)
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        self._httpx = httpx.AsyncClient(limits=limits, timeout=30)
        return httpx_sender(self._httpx)

    async def __aexit__(self, *exc: object) -> None:
        if self.kind == "aiohttp":
            await self._session.close()
        else:
            await self._httpx.aclose()


async def throughput(call: Call, seconds: float, concurrency: int) -> float:
    done = 0
    async with _client("aiohttp", concurrency) as send:
        await asyncio.gather(*(send(call) for _ in range(concurrency)))
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await send(call)
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - started)


def policy(workdir: Path, upstream: str) -> Path:
    path = workdir / f"bench-{upstream.rsplit(':', 1)[1]}.yaml"
    path.write_text(
        f"team: bench\napi_keys: [{{value: {KEY}}}]\n"
        f"providers:\n  gpt: {{kind: openai, base_url: '{upstream}/v1', api_key: up}}\n"
        f"  claude: {{kind: anthropic, base_url: '{upstream}', api_key: up}}\n"
        "routes:\n  - match: {model: 'claude-*'}\n    targets: [{provider: claude}]\n"
        "  - match: {model: '*'}\n    targets: [{provider: gpt}]\n"
        "retry: {max_attempts: 1}\nembedding_cache: {enabled: false}\nprompt_cache: {enabled: false}\n"
    )
    return path


def calls(upstream: str, proxy: str, endpoint: str) -> tuple[Call, Call]:
    proxied_path, direct_path, body, anthropic = ENDPOINTS[endpoint]
    json_type = {"content-type": "application/json"}
    via = Call(proxy + proxied_path, json.dumps(body).encode(), {**json_type, "authorization": f"Bearer {KEY}"})
    if anthropic:
        direct = Call(upstream + direct_path, json.dumps(DIRECT_TRANSLATED).encode(),
                      {**json_type, "x-api-key": "up", "anthropic-version": "2023-06-01"})
    else:
        direct = Call(upstream + direct_path, json.dumps(body).encode(), {**json_type, "authorization": "Bearer up"})
    return direct, via


def upstream_process(kind: str, port: int, delay_ms: float, http11: bool):
    if kind == "emulator":
        return emulator_process(port, delay_ms), f"http://127.0.0.1:{port}/_emulator/stats"
    extra = ["--http11"] if http11 else []
    return start([PY, str(ROOT / "bench" / "slow_upstream.py"), str(port), "--delay-ms", str(delay_ms), *extra]), f"http://127.0.0.1:{port}/"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--delay-ms", type=float, default=5.0, help="upstream time before answering")
    parser.add_argument("--upstreams", default="emulator,slow")
    parser.add_argument("--endpoints", default="chat,embeddings,responses,responses-translated")
    parser.add_argument("--clients", default="aiohttp,httpx")
    parser.add_argument("--slow-http11", action="store_true", help="the slow upstream keeps connections alive")
    parser.add_argument("--no-throughput", action="store_true")
    args = parser.parse_args()
    uvloop.install()
    rows = []
    workdir = Path(tempfile.mkdtemp(prefix="slipstream-bench-"))
    for kind in args.upstreams.split(","):
        procs = []
        try:
            port, proxy_port = free_port(), free_port()
            proc, ready = upstream_process(kind, port, args.delay_ms, args.slow_http11)
            procs.append(proc)
            wait_ready(ready)
            upstream = f"http://127.0.0.1:{port}"
            procs.append(start([PY, "-m", "gateway.cli", "serve", "--policy", str(policy(workdir, upstream)), "--port", str(proxy_port)]))
            wait_ready(f"http://127.0.0.1:{proxy_port}/healthz")
            proxy = f"http://127.0.0.1:{proxy_port}"
            for endpoint in args.endpoints.split(","):
                direct, via = calls(upstream, proxy, endpoint)
                for client in args.clients.split(","):
                    row = {"upstream": kind, "endpoint": endpoint, "client": client,
                           **asyncio.run(concurrency_one(client, direct, via, args.requests))}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                if not args.no_throughput:
                    row = {"upstream": kind, "endpoint": endpoint, "client": "aiohttp", "concurrency": 64,
                           "direct_rps": asyncio.run(throughput(direct, args.seconds, 64)),
                           "proxied_rps": asyncio.run(throughput(via, args.seconds, 64))}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            for proc in reversed(procs):
                stop(proc)
    print("\n| upstream | endpoint | client | direct p50 ms | proxied p50 ms | added p50 ms | x-slipstream-overhead-ms p50 |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        if "added_p50_ms" in row:
            print(f"| {row['upstream']} | {row['endpoint']} | {row['client']} | {row['direct_p50_ms']:.2f} | {row['proxied_p50_ms']:.2f} "
                  f"| {row['added_p50_ms']:.2f} | {row['header_p50_ms']:.2f} |")
    print("\n| upstream | endpoint | direct req/s (c=64) | proxied req/s (c=64) |")
    print("|---|---|---|---|")
    for row in rows:
        if "proxied_rps" in row:
            print(f"| {row['upstream']} | {row['endpoint']} | {row['direct_rps']:.0f} | {row['proxied_rps']:.0f} |")


if __name__ == "__main__":
    main()
