"""A plain thread-per-connection upstream (stdlib `http.server`) that waits before answering.

Real providers are slow and are not asyncio servers; this one answers every endpoint the overhead
benchmark sends (chat completions, embeddings, Responses, Anthropic messages) with a small canned
body of the provider's shape after `--delay-ms`. It is written the way such servers usually are:
`BaseHTTPRequestHandler` with its defaults (HTTP/1.0 unless `--http11`, headers and body written
with separate sends, Nagle left on unless `--nodelay`), because the point is to measure Slipstream
against upstreams it does not control.

    python bench/slow_upstream.py PORT [--delay-ms 5] [--http11] [--nodelay] [--backlog 128] [--idle-timeout-ms N]

With `--lost` it is also the benchmark of requests lost in front of such an upstream: it starts
itself as the upstream with a small listen backlog (the stdlib's 5 by default) and sends
`--requests` calls at `--concurrency` through Slipstream's upstream client (sdk/providers/http1.py)
and through aiohttp (what an ordinary client sees), counting answers, errors, and calls with no
answer within `--wait-s`:

    .venv/bin/python bench/slow_upstream.py --lost [--requests 10000] [--concurrency 64] [--backlog 5]
        [--http11 --idle-timeout-ms 20]   # keep-alive, idle connections closed by the server: the race
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_USAGE = {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20}
BODIES = {
    "/v1/chat/completions": {
        "id": "chatcmpl-slow", "object": "chat.completion", "created": 0, "model": "gpt-4o",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there, friend."}, "finish_reason": "stop"}],
        "usage": _USAGE,
    },
    "/v1/embeddings": {
        "object": "list", "model": "text-embedding-3-small",
        "data": [{"object": "embedding", "index": 0, "embedding": [0.01] * 256}],
        "usage": {"prompt_tokens": 8, "total_tokens": 8},
    },
    "/v1/responses": {
        "id": "resp_slow", "object": "response", "created_at": 0, "status": "completed", "model": "gpt-4o",
        "output": [{"type": "message", "id": "msg_slow", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": "Hello there, friend.", "annotations": []}]}],
        "usage": {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 8,
                  "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 20},
    },
    "/v1/messages": {
        "id": "msg_slow", "type": "message", "role": "assistant", "model": "claude-sonnet-4-6",
        "content": [{"type": "text", "text": "Hello there, friend."}], "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 8, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
    },
}
ENCODED = {path: json.dumps(body).encode() for path, body in BODIES.items()}


def handler(delay_s: float, http11: bool, nodelay: bool, idle_timeout_s: float | None = None) -> type[BaseHTTPRequestHandler]:
    class Slow(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if http11 else "HTTP/1.0"
        disable_nagle_algorithm = nodelay
        timeout = idle_timeout_s  # a kept-alive connection silent this long is closed (None: never)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            body = ENCODED.get(self.path.split("?")[0])
            time.sleep(delay_s)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    return Slow


async def _drive(call: Callable[[], Awaitable[int]], requests: int, concurrency: int, wait_s: float) -> Counter[str]:
    """`requests` calls, `concurrency` at a time; each outcome is a status, an error's type, or `lost`."""
    outcomes: Counter[str] = Counter()
    remaining = iter(range(requests))

    async def worker() -> None:
        for _ in remaining:
            try:
                async with asyncio.timeout(wait_s):
                    outcomes[str(await call())] += 1
            except TimeoutError:
                outcomes["lost"] += 1  # no answer within wait_s
            except Exception as exc:  # every failure is counted by its kind, none stops the run
                outcomes[type(exc).__name__] += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return outcomes


async def _lost(url: str, args: argparse.Namespace) -> dict[str, Counter[str]]:
    import aiohttp

    from sdk.providers.http1 import Http1Upstream
    from sdk.providers.upstream import Timeouts

    body = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode()
    headers = {"content-type": "application/json", "authorization": "Bearer up"}
    client = Http1Upstream()

    async def slipstream() -> int:
        response = await client.post(url, headers, body, Timeouts())
        await response.read()
        return response.status

    results = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        async def direct() -> int:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                status: int = response.status  # typed here: without the bench extra, mypy sees aiohttp as Any
                return status

        for name, call in (("slipstream", slipstream), ("aiohttp", direct)):
            results[name] = await _drive(call, args.requests, args.concurrency, args.wait_s)
    results["slipstream"]["sent again"] = client.resent
    await client.aclose()
    return results


def lost_requests(args: argparse.Namespace) -> None:
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    import uvloop

    from bench.proxy_overhead import PY, free_port, start, stop, wait_ready

    port = free_port()
    flags = ["--http11"] if args.http11 else []
    if args.idle_timeout_ms:
        flags += ["--idle-timeout-ms", str(args.idle_timeout_ms)]
    proc = start([PY, str(Path(__file__)), str(port), "--delay-ms", str(args.delay_ms), "--backlog", str(args.backlog), *flags])
    try:
        wait_ready(f"http://127.0.0.1:{port}/")
        started = time.perf_counter()
        results = uvloop.run(_lost(f"http://127.0.0.1:{port}/v1/chat/completions", args))
    finally:
        stop(proc)
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"{args.requests} requests per client, concurrency {args.concurrency}, backlog {args.backlog}, "
          f"{'HTTP/1.1' if args.http11 else 'HTTP/1.0'}, idle timeout {args.idle_timeout_ms or 'none'} ms, delay {args.delay_ms:g} ms, "
          f"{time.perf_counter() - started:.0f} s, load average {load}")
    print("| client | answered 200 | errors | no answer within the wait (lost) | sent again by the client |")
    print("|---|---|---|---|---|")
    for name, outcomes in results.items():
        errors = ", ".join(f"{kind} {n}" for kind, n in outcomes.items() if kind not in ("200", "lost", "sent again")) or "0"
        again = outcomes["sent again"] if name == "slipstream" else "-"
        print(f"| {name} | {outcomes['200']} | {errors} | {outcomes['lost']} | {again} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int, nargs="?")
    parser.add_argument("--delay-ms", type=float, default=5.0)
    parser.add_argument("--http11", action="store_true", help="keep-alive (protocol_version HTTP/1.1)")
    parser.add_argument("--nodelay", action="store_true", help="TCP_NODELAY on accepted sockets")
    parser.add_argument("--idle-timeout-ms", type=float, default=None, help="close kept-alive connections idle this long")
    # 128, the one setting changed from the stdlib's, for the latency benchmarks: a backlog of 5
    # overflows at concurrency 64 on HTTP/1.0 (a connect per call), which measures the backlog,
    # not the proxy. `--lost` uses the stdlib's 5 on purpose: no request may be lost to it.
    parser.add_argument("--backlog", type=int, default=None)
    parser.add_argument("--lost", action="store_true", help="count lost requests at --concurrency (see above)")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--wait-s", type=float, default=60.0)
    args = parser.parse_args()
    if args.lost:
        args.backlog = 5 if args.backlog is None else args.backlog
        lost_requests(args)
        return
    if args.port is None:
        parser.error("give the PORT to serve on (or --lost)")
    ThreadingHTTPServer.request_queue_size = 128 if args.backlog is None else args.backlog
    idle_s = args.idle_timeout_ms / 1000 if args.idle_timeout_ms else None
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(args.delay_ms / 1000, args.http11, args.nodelay, idle_s))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
