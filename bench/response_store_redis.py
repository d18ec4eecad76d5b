"""How long one script of the Redis response store holds Redis for a deep conversation: the
longest command Redis's own SLOWLOG records while a turn is written at the end of a chain of
`--depth` turns, and while that chain is read (as every turn that continues it does). Redis serves
every replica and team one command at a time, and the state guard gives each of their calls 100 ms.

    .venv/bin/python bench/response_store_redis.py [--depth 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo's packages when run as a script

from gateway.testing import running_redis
from sdk.responses.redis_store import RedisResponseStore
from sdk.responses.sqlite_store import SQLiteResponseStore
from sdk.responses.store import StoredResponse
from sdk.state import open_state
from sdk.state.guard import GuardedState


def _turn(response_id: str, previous: str | None) -> StoredResponse:
    return StoredResponse(response_id, "t", "p", False, time.time(), [{"role": "user", "content": "x"}],
                          {"id": response_id, "output": []}, previous)


async def _longest_ms(state: GuardedState, work: Awaitable[object]) -> float:
    client = state.shared.client
    await client.execute("SLOWLOG", "RESET")
    await work
    entries = await client.execute("SLOWLOG", "GET", "100000")
    held = [int(entry[2]) for entry in entries if entry[3][0].upper() != b"SLOWLOG"]  # not the reset's own time
    return max(held, default=0) / 1000  # microseconds → ms


async def main(depth: int) -> None:
    with running_redis() as server, tempfile.TemporaryDirectory() as scratch:
        state = open_state(f"{server.url}?prefix=b&timeout_ms=5000")
        assert isinstance(state, GuardedState)
        client = state.shared.client
        await client.execute("CONFIG", "SET", "slowlog-log-slower-than", "0")
        await client.execute("CONFIG", "SET", "slowlog-max-len", "100000")
        store = RedisResponseStore(state, SQLiteResponseStore(Path(scratch) / "fallback.sqlite3"))
        previous = None
        for turn in range(depth):
            await store.put(_turn(f"resp_{turn:08d}", previous))
            previous = f"resp_{turn:08d}"
        write = await _longest_ms(state, store.put(_turn("resp_last", previous)))
        read = await _longest_ms(state, store.chain("t", "resp_last"))
        print(f"a turn written after {depth} turns: the longest command held Redis {write:.2f} ms")
        print(f"the {depth + 1}-turn chain read: the longest command held Redis {read:.2f} ms")
        await store.close()
        await state.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=3_000)
    asyncio.run(main(parser.parse_args().depth))
