"""Shared state across replicas: limits that hold, what Redis costs per request, and an outage.

Three `slipstream serve` replicas on one redis-server, each a separate process, in front of the
emulator; the same three with in-process state are the baseline, measured in the same run.

1. Limits: a team limited to R requests/minute, a client sending 3R per minute round-robin over the
   replicas (open loop) for `--seconds`, after the bucket's initial burst is spent. Admitted
   requests against the ideal R × seconds / 60: shared state should be 1.00 (±2%), in-process 3.00.
2. Added latency: one replica with Redis against one with in-process state, requests alternating
   between them, at concurrency 1 and 64 (a team with a rate and a concurrency limit, so each
   request runs the admission script and its settlement); and the admission call alone
   (`GuardedState.admit`, in the benchmark's own process).
3. Outage: `--rate` requests/s over the three Redis replicas; Redis is killed for `--outage-s` in
   the middle and started again. Failed requests (anything but 200), latency, and whether every
   replica healed.

    .venv/bin/python bench/shared_state.py [--rpm 1200] [--seconds 30] [--requests 2000] [--rate 200] [--outage-s 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp
import uvloop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `bench.proxy_overhead` and the repo's packages when run as a script

from bench.proxy_overhead import PY, emulator_process, free_port, pct, start, stop, wait_ready  # noqa: E402
from gateway.testing import RedisServer  # noqa: E402

BODY = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16}).encode()


def policies(directory: Path, emulator_port: int, rpm: int) -> Path:
    upstream = f"providers:\n  gpt: {{kind: openai, base_url: 'http://127.0.0.1:{emulator_port}/v1', api_key: up}}\n" \
               "routes:\n  - match: {model: '*'}\n    targets: [{provider: gpt}]\nretry: {max_attempts: 1}\n"
    (directory / "limited.yaml").write_text(f"team: limited\napi_keys: [{{value: sk-limited}}]\n{upstream}limits: {{requests_per_minute: {rpm}}}\n")
    (directory / "busy.yaml").write_text(
        f"team: busy\napi_keys: [{{value: sk-busy}}]\n{upstream}limits: {{requests_per_minute: 100000000, max_concurrent: 100000}}\n")
    return directory


def replicas(policy_dir: Path, state_url: str | None, n: int) -> tuple[list, list[str]]:
    procs, urls = [], []
    for _ in range(n):
        port = free_port()
        args = [PY, "-m", "gateway.cli", "serve", "--policy-dir", str(policy_dir), "--port", str(port)]
        procs.append(start(args + (["--state-url", state_url] if state_url else [])))
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        wait_ready(f"{url}/healthz")
    return procs, urls


async def post(session: aiohttp.ClientSession, url: str, key: str) -> tuple[int, float]:
    started = time.perf_counter()
    try:
        async with session.post(f"{url}/v1/chat/completions", data=BODY,
                                headers={"authorization": f"Bearer {key}", "content-type": "application/json"}) as response:
            await response.read()
            return response.status, time.perf_counter() - started
    except aiohttp.ClientError:
        return 0, time.perf_counter() - started


async def open_loop(urls: list[str], key: str, rate: float, seconds: float, during=None) -> list[tuple[float, int, float]]:
    """Send `rate` requests/s round-robin for `seconds` whatever the answers take: (sent at, status, latency)."""
    results: list[tuple[float, int, float]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=30)) as session:
        begin = time.perf_counter()

        async def send(i: int) -> None:
            sent = time.perf_counter() - begin
            status, latency = await post(session, urls[i % len(urls)], key)
            results.append((sent, status, latency))

        tasks, side = [], asyncio.ensure_future(during()) if during else None
        for i in range(int(rate * seconds)):
            delay = begin + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(send(i)))
        await asyncio.gather(*tasks)
        if side is not None:
            await side
    return results


async def burst(urls: list[str], key: str, n: int) -> None:
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(post(session, urls[i % len(urls)], key) for i in range(n)))


def limits(urls: list[str], rpm: int, seconds: float) -> dict:
    asyncio.run(burst(urls, "sk-limited", rpm * 3 + 50))  # spend every replica's initial burst
    results = asyncio.run(open_loop(urls, "sk-limited", 3 * rpm / 60, seconds))
    admitted = sum(status == 200 for _, status, _ in results)
    refused = sum(status == 429 for _, status, _ in results)
    ideal = rpm * seconds / 60
    return {"sent": len(results), "admitted": admitted, "refused_429": refused, "other": len(results) - admitted - refused,
            "ideal": ideal, "admitted_over_ideal": admitted / ideal}


async def paired(local: str, shared: str, n: int, concurrency: int) -> dict:
    """Each worker alternates one request to the in-process replica and one to the Redis replica, so
    machine noise falls on both alike; also the proxies' own `x-slipstream-overhead-ms`."""
    seen: dict[str, tuple[list[float], list[float]]] = {"in_process": ([], []), "redis": ([], [])}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(name: str, url: str) -> None:
            started = time.perf_counter()
            async with session.post(f"{url}/v1/chat/completions", data=BODY,
                                    headers={"authorization": "Bearer sk-busy", "content-type": "application/json"}) as response:
                await response.read()
                assert response.status == 200, response.status
                seen[name][1].append(float(response.headers["x-slipstream-overhead-ms"]) / 1000)
            seen[name][0].append(time.perf_counter() - started)

        async def worker(count: int) -> None:
            for i in range(count):
                pair = [("in_process", local), ("redis", shared)]
                for name, url in pair if i % 2 else pair[::-1]:
                    await one(name, url)

        await worker(20)  # connections, scripts
        for values in seen.values():
            values[0].clear()
            values[1].clear()
        await asyncio.gather(*(worker(max(1, n // concurrency)) for _ in range(concurrency)))
    (base, base_own), (via, via_own) = seen["in_process"], seen["redis"]
    return {"in_process_p50_ms": pct(base, 0.5), "redis_p50_ms": pct(via, 0.5), "added_p50_ms": pct(via, 0.5) - pct(base, 0.5),
            "added_p99_ms": pct(via, 0.99) - pct(base, 0.99),
            "overhead_header_p50_ms": {"in_process": pct(base_own, 0.5), "redis": pct(via_own, 0.5)}}


async def admit_alone(state_url: str, n: int, concurrency: int) -> dict:
    """p50 ms of `GuardedState.admit` (one rate, one cap) with its settlement, in this process; and
    whether Redis answered them all (a timeout would have degraded the guard to local state)."""
    import uuid

    from sdk.state import open_state
    from sdk.state.backend import Admission, Cap, Rate, Settlement

    state = open_state(state_url)
    rate, cap = Rate("bench:rpm", 1e9, 1), Cap("bench:conc", 1_000_000)
    times: list[float] = []

    async def worker(count: int) -> None:
        for _ in range(count):
            lease = uuid.uuid4().hex
            started = time.perf_counter()
            await state.admit(Admission(lease, (rate,), (cap,)))
            times.append(time.perf_counter() - started)
            state.settle(Settlement(lease, (cap.key,)))

    await worker(50)  # connection, scripts loaded
    times.clear()
    await asyncio.gather(*(worker(n // concurrency) for _ in range(concurrency)))
    up = state.status()["up"]
    await state.close()
    return {"p50_ms": pct(times, 0.5), "p99_ms": pct(times, 0.99), "redis_answered_all": up}


def outage(urls: list[str], server: RedisServer, rate: float, outage_s: float) -> dict:
    lead = 5.0

    async def kill_and_restart() -> None:
        await asyncio.sleep(lead)
        server.stop()
        await asyncio.sleep(outage_s)
        server.start()

    results = asyncio.run(open_loop(urls, "sk-busy", rate, lead + outage_s + lead, kill_and_restart))
    time.sleep(2)
    healed = [json.load(urllib.request.urlopen(f"{url}/readyz"))["state"]["mode"] for url in urls]
    during = [latency for sent, _, latency in results if lead <= sent < lead + outage_s]
    return {"sent": len(results), "failed": sum(status != 200 for _, status, _ in results),
            "p50_ms_during": pct(during, 0.5), "p99_ms_during": pct(during, 0.99), "max_ms": max(l for *_, l in results) * 1000,
            "modes_after": healed}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rpm", type=int, default=1200, help="the limited team's requests per minute (R)")
    parser.add_argument("--seconds", type=float, default=30, help="length of the limits measurement")
    parser.add_argument("--requests", type=int, default=2000, help="requests per latency measurement")
    parser.add_argument("--rate", type=float, default=200, help="requests/s during the outage")
    parser.add_argument("--outage-s", type=float, default=10)
    args = parser.parse_args()
    uvloop.install()
    workdir = Path(tempfile.mkdtemp(prefix="slipstream-shared-"))
    server = RedisServer()
    server.start()
    procs = []
    try:
        emulator_port = free_port()
        procs.append(emulator_process(emulator_port, 5.0))
        wait_ready(f"http://127.0.0.1:{emulator_port}/_emulator/stats")
        policy_dir = policies(workdir, emulator_port, args.rpm)
        shared_procs, shared = replicas(policy_dir, server.url, 3)
        local_procs, local = replicas(policy_dir, None, 3)
        procs += shared_procs + local_procs

        for name, urls in (("redis", shared), ("in-process", local)):
            row = {"test": "limits", "state": name, "replicas": 3, "rpm": args.rpm, **limits(urls, args.rpm, args.seconds)}
            print(json.dumps(row), flush=True)

        for concurrency in (1, 64):
            row = asyncio.run(paired(local[0], shared[0], args.requests, concurrency))
            print(json.dumps({"test": "latency", "concurrency": concurrency, **row}), flush=True)
            alone = asyncio.run(admit_alone(f"{server.url}?timeout_ms=1000", args.requests, concurrency))
            print(json.dumps({"test": "admit-call", "concurrency": concurrency, **alone}), flush=True)

        print(json.dumps({"test": "outage", "rate": args.rate, "outage_s": args.outage_s, **outage(shared, server, args.rate, args.outage_s)}), flush=True)
    finally:
        for proc in reversed(procs):
            stop(proc)
        server.stop()


if __name__ == "__main__":
    main()
