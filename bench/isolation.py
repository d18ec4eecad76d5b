"""Isolation between teams: what one team's heavy traffic costs another team's small requests.

Two measurements, each against a baseline taken in the same run, on one machine, with the emulator,
the proxy and the load generators in separate processes:

1. `latency`: a small chat request from team `small` at concurrency 1, in alternating blocks: alone;
   while team `big` sends 5 MiB requests back to back (each one different, so no memo helps) from
   its own process to the same proxy; and, as a control, while `big` sends them to a second proxy
   process on the same machine. The control carries the same CPU load without sharing the proxy,
   so "beside" minus "control" is what sharing the proxy costs, apart from the machine's cores.
   Reports p50/p99 of each and the p99 added (goal: <= 5 ms).
2. `metrics`: `/metrics` size and render time as 10,000 requests name distinct invented models on a
   wildcard route (goal: flat).
3. `edge` (issue 25): team `small`'s latency, as in 1, while an unauthenticated or greedy client
   attacks: (a) `header`: one connection at a time sends a 64 MiB header; (b) `slowloris`: 1,500
   connections dribble a header line each per second (reopened when the proxy closes them);
   (c) `streams`: team `big` holds 1,000 streams that the upstream stalls (an emulator fault), all on
   the one provider origin both teams share. Each attack runs in its own process, against the proxy
   ("beside") and, as the control, against the second proxy; p99 beside minus control is the cost
   (goal: <= 5 ms). Loopback only; every block is bounded in requests and seconds, and the attacker
   is stopped (and killed if it must be) at the end of each block.

    .venv/bin/python bench/isolation.py [--part latency|metrics|edge|both] [--requests 400] [--rounds 4]
        [--big-mib 5] [--models 10000] [--semantic] [--attacks header,slowloris,streams]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import random
import string
import sys
import tempfile
import time
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path

import aiohttp
import orjson
import uvloop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.proxy_overhead import PY, emulator_process, free_port, pct, start, stop, wait_ready  # noqa: E402

SMALL_KEY, BIG_KEY = "sk-small-team", "sk-big-team"
SMALL = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "Say hello in one short sentence."}], "max_tokens": 16})


def _policy(directory: Path, team: str, key: str, emu_port: int, semantic: bool) -> None:
    cache = "semantic_cache: {enabled: true, cache_sampled: true}\n" if semantic else ""
    (directory / f"{team}.yaml").write_text(
        f"team: {team}\napi_keys: [{{value: {key}}}]\n"
        f"providers:\n  gpt: {{kind: openai, base_url: 'http://127.0.0.1:{emu_port}/v1', api_key: up}}\n"
        "routes:\n  - match: {model: '*'}\n    targets: [{provider: gpt}]\nretry: {max_attempts: 1}\n"
        "limits: {max_body_bytes: 67108864}\n" + cache
    )


def _big_sender(urls: list[str], mib: float, running: mp.synchronize.Event, target: Synchronized[int],
                stop_all: mp.synchronize.Event, sent: Synchronized[int]) -> None:
    """Team `big`, in its own process: 5 MiB system prompts, each different, one after another."""
    import httpx

    filler = ("The quarterly report lists every shipment, its weight, its route and its customs code. " * 64)
    # A model the emulator gives no context window: 5 MiB is past gpt-4o's 128k tokens, which it answers with a quick 400.
    body = orjson.dumps({"model": "gpt-large-context", "max_tokens": 16, "messages": [
        {"role": "system", "content": (filler * int(mib * 1024 * 1024 / len(filler) + 1))[: int(mib * 1024 * 1024)]},
        {"role": "user", "content": "Summarize."}]})
    marker = body.index(b"The quarterly")
    with httpx.Client(timeout=120) as client:
        while not stop_all.is_set():
            if not running.wait(0.1):
                continue
            salt = "".join(random.choices(string.ascii_letters, k=16)).encode()
            unique = body[:marker] + salt + body[marker + len(salt):]  # same size, new prompt
            client.post(urls[target.value], content=unique, headers={"authorization": f"Bearer {BIG_KEY}", "content-type": "application/json"})
            with sent.get_lock():
                sent.value += 1


async def _small_block(session: aiohttp.ClientSession, url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        async with session.post(url, data=SMALL, headers={"authorization": f"Bearer {SMALL_KEY}", "content-type": "application/json"}) as r:
            await r.read()
            assert r.status == 200, r.status
        out.append(time.perf_counter() - started)
    return out


async def latency(url: str, control_url: str, args: argparse.Namespace) -> None:
    ctx = mp.get_context("spawn")
    running, stop_all, sent, target = ctx.Event(), ctx.Event(), ctx.Value("i", 0), ctx.Value("i", 0)
    sender = ctx.Process(target=_big_sender, args=([url, control_url], args.big_mib, running, target, stop_all, sent), daemon=True)
    sender.start()
    samples: dict[str, list[float]] = {"alone": [], "beside": [], "control": []}
    per_block = args.requests // args.rounds
    try:
        async with aiohttp.ClientSession() as session:
            await _small_block(session, url, 20)  # warm up
            for _ in range(args.rounds):
                samples["alone"] += await _small_block(session, url, per_block)
                for name, index in (("beside", 0), ("control", 1)):
                    target.value = index
                    running.set()
                    before = sent.value
                    while sent.value == before:  # the big sender is under way
                        if not sender.is_alive():
                            raise RuntimeError(f"the big sender stopped (exit code {sender.exitcode}); see its error above")
                        await asyncio.sleep(0.05)
                    samples[name] += await _small_block(session, url, per_block)
                    running.clear()
                    await asyncio.sleep(1.0)  # let the big request in flight finish
    finally:
        stop_all.set()
        sender.join(timeout=30)
    alone = samples["alone"]
    for name, values in samples.items():
        print(f"{name:>8}: p50 {pct(values, 0.5):8.2f} ms  p99 {pct(values, 0.99):8.2f} ms  (n={len(values)})")
    print(f"{sent.value} big requests of {args.big_mib:g} MiB answered")
    for name in ("beside", "control"):
        print(f"added, {name} vs alone: p50 {pct(samples[name], 0.5) - pct(alone, 0.5):+8.2f} ms  "
              f"p99 {pct(samples[name], 0.99) - pct(alone, 0.99):+8.2f} ms")
    print(f"sharing the proxy (beside vs control): p50 {pct(samples['beside'], 0.5) - pct(samples['control'], 0.5):+8.2f} ms  "
          f"p99 {pct(samples['beside'], 0.99) - pct(samples['control'], 0.99):+8.2f} ms  (goal: p99 <= +5 ms)")


async def metrics(base: str, args: argparse.Namespace) -> None:
    url = f"{base}/v1/chat/completions"
    checkpoints = sorted({0, args.models // 10, args.models // 2, args.models})
    done = 0
    async with aiohttp.ClientSession() as session:
        async def scrape() -> tuple[int, float]:
            best = float("inf")
            size = 0
            for _ in range(3):
                started = time.perf_counter()
                async with session.get(f"{base}/metrics") as r:
                    size = len(await r.read())
                best = min(best, time.perf_counter() - started)
            return size, best * 1000

        async def one(i: int) -> None:
            body = orjson.dumps({"model": f"gpt-invented-{i}-{random.random():.6f}", "max_tokens": 4,
                                 "messages": [{"role": "user", "content": "hi"}]})
            async with session.post(url, data=body, headers={"authorization": f"Bearer {SMALL_KEY}", "content-type": "application/json"}) as r:
                await r.read()

        first = None
        for mark in checkpoints:
            while done < mark:
                batch = range(done, min(mark, done + 64))
                await asyncio.gather(*(one(i) for i in batch))
                done = batch[-1] + 1
            size, ms = await scrape()
            first = first or (size, ms)
            print(f"after {mark:>6} invented model names: /metrics {size / 1024:8.1f} KiB, rendered in {ms:6.2f} ms "
                  f"(x{size / first[0]:.2f} size, x{ms / first[1]:.2f} time vs the first scrape)")


SLOW_MODEL = "gpt-slow-stream"


async def _header_attack(url: str, engaged: mp.synchronize.Event, stop_all: mp.synchronize.Event) -> None:
    """One connection at a time sends `X-Big:` and then up to 64 MiB, until the proxy closes it."""
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    chunk = b"a" * 65536
    while not stop_all.is_set():
        try:
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-big: ")
            for _ in range(1024):  # 64 MiB
                writer.write(chunk)
                await writer.drain()
                engaged.set()
                if stop_all.is_set():
                    break
            writer.close()
        except OSError:
            continue


async def _slowloris(url: str, engaged: mp.synchronize.Event, stop_all: mp.synchronize.Event, count: int = 1500) -> None:
    """`count` connections, each sending one header line a second; a closed one is opened again."""
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    opened = 0

    async def one() -> None:
        nonlocal opened
        while not stop_all.is_set():
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
                opened += 1
                if opened >= count:
                    engaged.set()
                writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
                while not stop_all.is_set() and not reader.at_eof():
                    writer.write(b"x-slow: 1\r\n")
                    await writer.drain()
                    await asyncio.sleep(1.0)
                writer.close()
            except OSError:
                await asyncio.sleep(0.1)

    await asyncio.gather(*(one() for _ in range(count)))


async def _slow_streams(url: str, engaged: mp.synchronize.Event, stop_all: mp.synchronize.Event, count: int = 1000) -> None:
    """Team `big` opens `count` streams of a model whose upstream stalls, and keeps them open."""
    body = orjson.dumps({"model": SLOW_MODEL, "stream": True, "max_tokens": 16, "messages": [{"role": "user", "content": "wait"}]})
    connector = aiohttp.TCPConnector(limit=0)
    statuses: dict[int | str, int] = {}
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        async def one() -> None:
            while not stop_all.is_set():
                try:
                    async with session.post(url, data=body, headers={"authorization": f"Bearer {BIG_KEY}"}) as response:
                        statuses[response.status] = statuses.get(response.status, 0) + 1
                        async for _ in response.content.iter_any():
                            pass
                        if response.status != 200:
                            await asyncio.sleep(1.0)  # a refused stream is tried again, not in a loop
                except aiohttp.ClientError as exc:
                    statuses[type(exc).__name__] = statuses.get(type(exc).__name__, 0) + 1
                    await asyncio.sleep(0.1)

        tasks = [asyncio.create_task(one()) for _ in range(count)]
        engaged.set()
        while not stop_all.is_set():
            await asyncio.sleep(0.1)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    print(f"  (slow streams by status or error: {statuses})", flush=True)


_ATTACKS = {"header": _header_attack, "slowloris": _slowloris, "streams": _slow_streams}


def _attacker(kind: str, url: str, engaged: mp.synchronize.Event, stop_all: mp.synchronize.Event) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    uvloop.run(_ATTACKS[kind](url, engaged, stop_all))


async def _small_block_counted(session: aiohttp.ClientSession, url: str, n: int, deadline: float) -> tuple[list[float], int]:
    """Like `_small_block`, but a refused or failed request is counted, not fatal, and the block stops at `deadline`."""
    out, failed = [], 0
    for _ in range(n):
        if time.monotonic() > deadline:
            break
        started = time.perf_counter()
        try:
            async with session.post(url, data=SMALL, headers={"authorization": f"Bearer {SMALL_KEY}", "content-type": "application/json"}) as r:
                await r.read()
                failed += r.status != 200
        except (TimeoutError, aiohttp.ClientError):
            failed += 1
        out.append(time.perf_counter() - started)
    return out, failed


async def _steady(session: aiohttp.ClientSession, emu: str, open_before: int, kind: str, deadline: float) -> int:
    """Wait for the attack's steady state: 2 s, and for `streams` until the requests open at the
    upstream stay the same for 3 s (the proxy has forwarded all it will). Returns how many are open."""
    await asyncio.sleep(2.0)
    seen: list[int] = []
    while True:
        async with session.get(f"{emu}/_emulator/stats") as r:
            seen.append((await r.json())["open_requests"] - open_before)
        if kind != "streams" or (len(set(seen[-3:])) == 1 and len(seen) >= 3 and seen[-1] > 1) or time.monotonic() > deadline:
            return seen[-1]
        await asyncio.sleep(1.0)


async def edge(url: str, control_url: str, emu: str, args: argparse.Namespace) -> None:
    ctx = mp.get_context("spawn")
    per_block = args.requests // args.rounds
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await _small_block(session, url, 20)  # warm up
        for kind in args.attacks.split(","):
            samples: dict[str, list[float]] = {"alone": [], "beside": [], "control": []}
            failures = {"alone": 0, "beside": 0, "control": 0}
            held = {"alone": 0, "beside": 0, "control": 0}  # requests open at the upstream during the attack
            for _ in range(args.rounds):
                got, failed = await _small_block_counted(session, url, per_block, time.monotonic() + args.block_s)
                samples["alone"] += got
                failures["alone"] += failed
                for side, target in (("beside", url), ("control", control_url)):
                    if kind == "streams":  # the upstream stalls the next 1,000 streams of the slow model
                        async with session.post(f"{emu}/_emulator/faults", json={
                                "fault": f"stall:ms={int(args.block_s * 3000)}", "count": 1000, "match": {"model": SLOW_MODEL}}) as r:
                            assert r.status == 200, await r.text()
                    async with session.get(f"{emu}/_emulator/stats") as r:
                        open_before = (await r.json())["open_requests"]
                    engaged, stop_all = ctx.Event(), ctx.Event()
                    attacker = ctx.Process(target=_attacker, args=(kind, target, engaged, stop_all), daemon=True)
                    attacker.start()
                    try:
                        await asyncio.to_thread(engaged.wait, args.block_s)
                        held[side] = max(held[side], await _steady(session, emu, open_before, kind, time.monotonic() + args.block_s))
                        got, failed = await _small_block_counted(session, url, per_block, time.monotonic() + args.block_s)
                        samples[side] += got
                        failures[side] += failed
                    finally:
                        stop_all.set()
                        await asyncio.to_thread(attacker.join, 15)
                        if attacker.is_alive():
                            attacker.kill()
                    await asyncio.sleep(3.0)  # the attack's connections and upstream requests wind down
            for side, values in samples.items():
                print(f"{kind:>9} {side:>8}: p50 {pct(values, 0.5):8.2f} ms  p99 {pct(values, 0.99):8.2f} ms  "
                      f"(n={len(values)}, failed {failures[side]}, upstream requests open: {held[side]})")
            print(f"{kind:>9} sharing the proxy (beside vs control): p99 "
                  f"{pct(samples['beside'], 0.99) - pct(samples['control'], 0.99):+8.2f} ms  (goal: <= +5 ms); "
                  f"load average {os.getloadavg()[0]:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=("latency", "metrics", "edge", "both"), default="both")
    parser.add_argument("--attacks", default="header,slowloris,streams", help="with --part edge: which attacks, in order")
    parser.add_argument("--block-s", type=float, default=20.0, help="with --part edge: the most one block of small requests takes")
    parser.add_argument("--requests", type=int, default=400, help="small requests per side (alone / beside big ones)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--big-mib", type=float, default=5.0)
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--semantic", action="store_true", help="both teams run the semantic cache (the shared embedder)")
    args = parser.parse_args()
    uvloop.install()
    workdir = Path(tempfile.mkdtemp(prefix="slipstream-isolation-"))
    procs = []
    try:
        emu_port, proxy_port, control_port = free_port(), free_port(), free_port()
        procs.append(emulator_process(emu_port, 1.0))
        wait_ready(f"http://127.0.0.1:{emu_port}/_emulator/stats")
        _policy(workdir, "small", SMALL_KEY, emu_port, args.semantic)
        _policy(workdir, "big", BIG_KEY, emu_port, args.semantic)
        procs.append(start([PY, "-m", "gateway.cli", "serve", "--policy-dir", str(workdir), "--port", str(proxy_port)],
                           env={"SLIPSTREAM_DATA_DIR": str(workdir / "data")}))
        base = f"http://127.0.0.1:{proxy_port}"
        wait_ready(f"{base}/readyz")
        control = f"http://127.0.0.1:{control_port}"
        if args.part in ("latency", "edge", "both"):  # a second proxy: the control's attack goes there
            procs.append(start([PY, "-m", "gateway.cli", "serve", "--policy-dir", str(workdir), "--port", str(control_port)],
                               env={"SLIPSTREAM_DATA_DIR": str(workdir / "control-data")}))
            wait_ready(f"{control}/readyz")
        print(f"machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}")
        if args.part in ("latency", "both"):
            asyncio.run(latency(f"{base}/v1/chat/completions", f"{control}/v1/chat/completions", args))
        if args.part in ("metrics", "both"):
            asyncio.run(metrics(base, args))
        if args.part == "edge":
            asyncio.run(edge(f"{base}/v1/chat/completions", f"{control}/v1/chat/completions", f"http://127.0.0.1:{emu_port}", args))
    finally:
        for proc in procs:
            stop(proc)


if __name__ == "__main__":
    main()
