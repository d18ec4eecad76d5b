"""CPU the state backend costs per request: one admission and its settlement (a rate, a lease, a
priced spend record), far from every limit, from `--concurrency` callers on one uvloop, against a
throwaway redis-server and against in-process state in the same run. Process CPU time (user +
system) per request; the callers' own loop is in both.

    .venv/bin/python bench/state_path.py [--requests 19200] [--concurrency 64] [--topology single|cluster|sentinel]

`--topology cluster` runs the Redis side on a throwaway three-master Redis Cluster, `sentinel` through
a Sentinel to a master with one replica (both need redis-cli: `gateway/testing.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo's packages when run as a script

import contextlib
import tempfile
from collections.abc import Iterator

from gateway.testing import RedisClusterServers, RedisSentinelServers, running_redis
from sdk.state import open_state
from sdk.state.backend import Admission, Cap, Rate, Settlement, SpendRecord

# Named as the limits stage and sdk/spend.py name them: a team's keys share one Cluster hash slot ({bench})
RATE, CAP = Rate("limit:{bench}:rpm", 1e9, 1), Cap("limit:{bench}:conc", 1_000_000)
SPEND = SpendRecord(0.001, (("spend:{bench}:day:x", 86_400), ("spend:{bench}:month:x", 2_678_400)), ("total", "key:k", "model:m"))


async def cpu_us_per_request(url: str, requests: int, concurrency: int) -> dict[str, Any]:
    state = open_state(url)

    async def caller(count: int) -> None:
        for _ in range(count):
            lease = secrets.token_hex(16)
            await state.admit(Admission(lease, (RATE,), (CAP,)))
            await asyncio.sleep(0)  # the request's upstream call, as short as it gets
            state.settle(Settlement(lease, (CAP.key,), (), SPEND))
            await asyncio.sleep(0)

    await caller(100)  # connection, scripts, room heard
    per_caller = requests // concurrency
    started = time.process_time()
    await asyncio.gather(*(caller(per_caller) for _ in range(concurrency)))
    while getattr(state, "_pending", None):  # the last batches reach Redis: their CPU counts too
        await asyncio.sleep(0.001)
    used = time.process_time() - started
    mode = state.status()["mode"] if hasattr(state, "status") else "local"
    await state.close()
    return {"cpu_us_per_request": used / (per_caller * concurrency) * 1e6, "mode_after": mode}


@contextlib.contextmanager
def redis_url(topology: str) -> Iterator[str]:
    if topology == "single":
        with running_redis() as server:
            yield server.url
        return
    with tempfile.TemporaryDirectory() as workdir:
        group = (RedisClusterServers if topology == "cluster" else RedisSentinelServers)(Path(workdir))
        try:
            group.start()
            yield group.url
        finally:
            group.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=19_200)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--topology", choices=("single", "cluster", "sentinel"), default="single")
    args = parser.parse_args()
    with redis_url(args.topology) as server:
        for name, url in ((f"redis-{args.topology}", f"{server}?timeout_ms=2000"), ("in_process", "")):
            row = uvloop.run(cpu_us_per_request(url, args.requests, args.concurrency))
            print(json.dumps({"state": name, "concurrency": args.concurrency, **row}), flush=True)


if __name__ == "__main__":
    main()
