"""The heavy-work pool (sdk/offload.py) every team's large requests share."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import openai

from gateway.testing import running_proxy
from sdk import requests
from sdk.offload import TENANT, off_loop
from tests.helpers import PATIENCE_S, requires_extra, write_policy


async def test_the_heavy_work_pool_serves_teams_in_turn():
    """Parsing, hashing, counting and serializing a large request run in two threads every team
    shares. They were taken first come, first served, so a team's queue of big requests held
    another team's big request until all of it had run: here team b's one job ran after nine of
    team a's ten. Each team's work waits in a queue of its own now, and the teams take turns."""
    gate = threading.Event()
    ran: list[str] = []

    def work(team: str) -> None:
        gate.wait(PATIENCE_S)  # both threads held until every job is queued
        ran.append(team)

    async def submitted(team: str) -> None:
        TENANT.set(team)  # as the door core does once it knows the team
        await off_loop(work, team)

    queued = [asyncio.create_task(submitted("a")) for _ in range(10)]
    await asyncio.sleep(0)
    queued.append(asyncio.create_task(submitted("b")))
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(*queued)
    assert ran.index("b") <= 3  # after the two running and at most one turn of team a (10 before)


def test_a_large_request_is_parsed_as_its_teams_work(tmp_path: Path, fresh_emulator, monkeypatch):
    """The door core names the team before the body is parsed, so the pool knows whose turn it is."""
    tenants: list[str] = []
    parse = requests.parse_request

    def recorded(*args, **kwargs):
        tenants.append(TENANT.get())
        return parse(*args, **kwargs)

    monkeypatch.setattr(requests, "parse_request", recorded)
    write_policy(tmp_path, "alpha", "sk-alpha-heavy", fresh_emulator.url)
    with running_proxy([tmp_path]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-alpha-heavy", max_retries=0)
        client.chat.completions.create(model="gpt-4o", max_tokens=8, messages=[{"role": "user", "content": "word " * 60_000}])
    assert tenants == ["alpha"]


@requires_extra("semantic")  # compression's default turns document pruning on
def test_compression_runs_in_the_heavy_work_pool_as_its_teams_work(tmp_path: Path, fresh_emulator, monkeypatch):
    """Compression's CPU work ran in asyncio's default pool, first come, first served, so one team's
    compression of large documents held every other team's (and the response store's SQLite calls,
    which share that pool). It runs in the heavy-work pool now, where the teams take turns."""
    from sdk.compression import compressor

    ran: list[tuple[str, str]] = []
    counts = compressor._body_counts

    def recorded(team: str, body: dict) -> list[int]:
        ran.append((threading.current_thread().name.rsplit("-", 1)[0], TENANT.get()))
        return counts(team, body)

    monkeypatch.setattr(compressor, "_body_counts", recorded)
    write_policy(tmp_path, "alpha", "sk-alpha-heavy", fresh_emulator.url, extra="compression: {enabled: true}\n")
    with running_proxy([tmp_path]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-alpha-heavy", max_retries=0)
        client.chat.completions.create(model="gpt-4o", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
    assert ran == [("slipstream-heavy", "alpha")]
