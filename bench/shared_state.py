"""Shared state across replicas: limits that hold, what Redis costs per request, and an outage.

Three `slipstream serve` replicas on one redis-server, each a separate process, in front of the
emulator; the same three with in-process state are the baseline, measured in the same run.

1. Limits: a team limited to R requests/minute, a client sending 3R per minute round-robin over the
   replicas (open loop) for `--seconds`, after the bucket's initial burst is spent. Admitted
   requests against the ideal R × seconds / 60: shared state should be 1.00 (±2%), in-process 3.00.
2. Added latency: one replica with Redis against one with in-process state, requests alternating
   between them, at concurrency 1 and 64 (a team with a rate and a concurrency limit far from
   reached, so each request is admitted, charged and settled in Redis; most go ahead without waiting,
   sdk/state/headroom.py), with each replica's CPU time per request and how the Redis replica
   admitted; and the admission call alone in the benchmark's own process (as a request sees it, and
   the checked round trip a request near its limit waits for).
3. The same with a long prompt whose last message is new every time (`ledger`): the Redis replica
   already holds the rest, so it reads nothing before planning; and with a conversation's second
   turn whose first went through another Redis replica just before (`latency-ledger-moved`): the
   Redis replica reads the shared ledger once, and expects what the first turn cached.
4. Outage: `--rate` requests/s over the three Redis replicas; Redis is killed for `--outage-s` in
   the middle and started again. Failed requests (anything but 200), latency, and whether every
   replica healed.

    .venv/bin/python bench/shared_state.py [--rpm 1200] [--seconds 30] [--requests 2000] [--rate 200] [--outage-s 10]
                                           [--parts limits,latency,ledger,outage]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

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


def replicas(policy_dir: Path, state_url: str | None, n: int) -> tuple[list[Any], list[str]]:
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


def limits(urls: list[str], rpm: int, seconds: float) -> dict[str, Any]:
    asyncio.run(burst(urls, "sk-limited", rpm * 3 + 50))  # spend every replica's initial burst
    results = asyncio.run(open_loop(urls, "sk-limited", 3 * rpm / 60, seconds))
    admitted = sum(status == 200 for _, status, _ in results)
    refused = sum(status == 429 for _, status, _ in results)
    ideal = rpm * seconds / 60
    return {"sent": len(results), "admitted": admitted, "refused_429": refused, "other": len(results) - admitted - refused,
            "ideal": ideal, "admitted_over_ideal": admitted / ideal}


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def admissions(url: str) -> dict[str, float]:
    """slipstream_state_admissions_total by how (checked | ahead | local) from a replica's /metrics."""
    counts = {}
    for line in urllib.request.urlopen(f"{url}/metrics").read().decode().splitlines():
        if line.startswith("slipstream_state_admissions_total{"):
            counts[line.split('how="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return counts


def long_prompt(i: int) -> bytes:
    """A 2,000-token system prompt (cacheable) and a new question each time: every request's last
    prefix is new, so the Redis replica reads the shared prompt-cache ledger once before planning."""
    return json.dumps({"model": "gpt-4o", "max_tokens": 16, "messages": [
        {"role": "system", "content": "You are the support assistant. Answer from the manual and cite the section. " * 130},
        {"role": "user", "content": f"Question {i}: how do I reset the device? " * 4}]}).encode()


def second_turn(i: int) -> bytes:
    """The next turn of `long_prompt(i)`'s conversation (its first turn went through another replica)."""
    body = json.loads(long_prompt(i))
    body["messages"] += [{"role": "assistant", "content": "Hold the button for ten seconds."},
                         {"role": "user", "content": "And if that does not work?"}]
    return json.dumps(body).encode()


async def paired(local: tuple[str, int], shared: tuple[str, int], n: int, concurrency: int, body=lambda i: BODY,
                 elsewhere: str | None = None) -> dict[str, Any]:
    """Each worker alternates one request to the in-process replica and one to the Redis replica, so
    machine noise falls on both alike; also the proxies' own `x-slipstream-overhead-ms`, their CPU
    time per request (less noisy than latency on a busy machine), and how the Redis replica admitted.
    With `elsewhere`, each measured request's conversation had its first turn (`long_prompt`, not
    measured) sent through that replica just before."""
    seen: dict[str, tuple[list[float], list[float]]] = {"in_process": ([], []), "redis": ([], [])}
    sent = iter(range(1 << 30))
    headers = {"authorization": "Bearer sk-busy", "content-type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(name: str, url: str, i: int) -> None:
            started = time.perf_counter()
            async with session.post(f"{url}/v1/chat/completions", data=body(i), headers=headers) as response:
                await response.read()
                assert response.status == 200, response.status
                seen[name][1].append(float(response.headers["x-slipstream-overhead-ms"]) / 1000)
            seen[name][0].append(time.perf_counter() - started)

        async def first_turn(i: int) -> None:
            async with session.post(f"{elsewhere}/v1/chat/completions", data=long_prompt(i), headers=headers) as response:
                await response.read()

        async def worker(count: int) -> None:
            for i in range(count):
                pair = [("in_process", local[0]), ("redis", shared[0])]
                ids = (next(sent), next(sent))
                if elsewhere:
                    await asyncio.gather(*(first_turn(k) for k in ids))
                for (name, url), k in zip(pair if i % 2 else pair[::-1], ids, strict=True):
                    await one(name, url, k)

        await worker(20)  # connections, scripts
        for values in seen.values():
            values[0].clear()
            values[1].clear()
        how_before, cpu_before = admissions(shared[0]), (cpu_s(local[1]), cpu_s(shared[1]))
        await asyncio.gather(*(worker(max(1, n // concurrency)) for _ in range(concurrency)))
        how_after, cpu_after = admissions(shared[0]), (cpu_s(local[1]), cpu_s(shared[1]))
    (base, base_own), (via, via_own) = seen["in_process"], seen["redis"]
    per_request = [(after - before) / len(base) * 1000 for before, after in zip(cpu_before, cpu_after, strict=True)]
    return {"in_process_p50_ms": pct(base, 0.5), "redis_p50_ms": pct(via, 0.5), "added_p50_ms": pct(via, 0.5) - pct(base, 0.5),
            "added_p99_ms": pct(via, 0.99) - pct(base, 0.99),
            "overhead_header_p50_ms": {"in_process": pct(base_own, 0.5), "redis": pct(via_own, 0.5)},
            "cpu_ms_per_request": {"in_process": per_request[0], "redis": per_request[1]},
            "admissions": {how: how_after.get(how, 0) - how_before.get(how, 0) for how in how_after}}


async def admit_alone(state_url: str, n: int, concurrency: int) -> dict[str, Any]:
    """p50 ms of `GuardedState.admit` (one rate, one cap, far from both) with its settlement, in this
    process, as a request sees it (granted ahead after the first); and of the checked admission's
    round trip alone (`RedisState.admit`: the script in Redis, what a request near its limit waits).
    Whether Redis answered them all (a timeout would have degraded the guard to local state)."""
    import uuid

    from sdk.observability.metrics import STATE_ADMISSIONS
    from sdk.state import open_state
    from sdk.state.backend import Admission, Cap, Rate, Settlement
    from sdk.state.guard import GuardedState

    state = open_state(state_url)
    assert isinstance(state, GuardedState), "a redis:// URL opens the guarded shared state"
    rate, cap = Rate("bench:rpm", 1e9, 1), Cap("bench:conc", 1_000_000)
    seen: dict[str, list[float]] = {"as_seen": [], "checked": []}

    async def worker(count: int) -> None:
        for i in range(count):
            lease = uuid.uuid4().hex
            started = time.perf_counter()
            if i % 2:
                await state.admit(Admission(lease, (rate,), (cap,)))
                seen["as_seen"].append(time.perf_counter() - started)
            else:
                await state.shared.admit(Admission(lease, (rate,), (cap,)))
                seen["checked"].append(time.perf_counter() - started)
            state.settle(Settlement(lease, (cap.key,)))

    await worker(50)  # connection, scripts loaded
    for values in seen.values():
        values.clear()
    local = STATE_ADMISSIONS.labels("local")._value.get()
    await asyncio.gather(*(worker(n // concurrency) for _ in range(concurrency)))
    up = state.status()["up"] and STATE_ADMISSIONS.labels("local")._value.get() == local  # never degraded meanwhile
    await state.close()
    return {**{f"{name}_p50_ms": pct(values, 0.5) for name, values in seen.items()},
            **{f"{name}_p99_ms": pct(values, 0.99) for name, values in seen.items()}, "redis_answered_all": up}


def outage(urls: list[str], server: RedisServer, rate: float, outage_s: float) -> dict[str, Any]:
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
            "p50_ms_during": pct(during, 0.5), "p99_ms_during": pct(during, 0.99), "max_ms": max(latency for *_, latency in results) * 1000,
            "modes_after": healed}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rpm", type=int, default=1200, help="the limited team's requests per minute (R)")
    parser.add_argument("--seconds", type=float, default=30, help="length of the limits measurement")
    parser.add_argument("--requests", type=int, default=2000, help="requests per latency measurement")
    parser.add_argument("--rate", type=float, default=200, help="requests/s during the outage")
    parser.add_argument("--outage-s", type=float, default=10)
    parser.add_argument("--parts", default="limits,latency,ledger,outage", help="which measurements to run (comma-separated)")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
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

        for name, urls in (("redis", shared), ("in-process", local)) if "limits" in parts else ():
            row = {"test": "limits", "state": name, "replicas": 3, "rpm": args.rpm, **limits(urls, args.rpm, args.seconds)}
            print(json.dumps(row), flush=True)

        for concurrency in (1, 64) if "latency" in parts else ():
            row = asyncio.run(paired((local[0], local_procs[0].pid), (shared[0], shared_procs[0].pid), args.requests, concurrency))
            print(json.dumps({"test": "latency", "concurrency": concurrency, **row}), flush=True)
            alone = asyncio.run(admit_alone(f"{server.url}?timeout_ms=1000", args.requests, concurrency))
            print(json.dumps({"test": "admit-call", "concurrency": concurrency, **alone}), flush=True)

        for concurrency in (1, 64) if "ledger" in parts else ():
            row = asyncio.run(paired((local[0], local_procs[0].pid), (shared[0], shared_procs[0].pid), args.requests // 4,
                                     concurrency, long_prompt))
            print(json.dumps({"test": "latency-ledger", "concurrency": concurrency, **row}), flush=True)
            row = asyncio.run(paired((local[0], local_procs[0].pid), (shared[0], shared_procs[0].pid), args.requests // 4,
                                     concurrency, second_turn, elsewhere=shared[1]))
            print(json.dumps({"test": "latency-ledger-moved", "concurrency": concurrency, **row}), flush=True)

        if "outage" in parts:
            row = outage(shared, server, args.rate, args.outage_s)
            print(json.dumps({"test": "outage", "rate": args.rate, "outage_s": args.outage_s, **row}), flush=True)
    finally:
        for proc in reversed(procs):
            stop(proc)
        server.stop()


if __name__ == "__main__":
    main()
