"""A team's cache invalidations take their turn with every team's cache stores, through the proxy.

`DELETE /v1/slipstream/cache` ran in asyncio's default thread pool, first come, first served and shared
with every `to_thread` caller (policy reloads, /metrics, the shared cache's replication), and each call
held the cache store's writer lock every team's stores wait on: one team's many invalidations held them
all. Each is now one of the team's turns in the cache stores' own thread (sdk/offload.py:FairPool), as a
store is.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx

from gateway.testing import running_proxy
from tests.helpers import PATIENCE_S, oai, skip_without_extra, write_policy

skip_without_extra("semantic")  # the policy turns the response cache on (faiss)

KEY = "sk-alpha-invalidate"


def test_an_invalidation_is_its_teams_turn_in_the_cache_stores_thread(tmp_path, monkeypatch, fresh_emulator) -> None:
    from sdk.cache.store import CacheStore

    ran: list[str] = []
    invalidate = CacheStore.invalidate

    def recorded(self: CacheStore, *args: Any, **kwargs: Any) -> int:
        ran.append(threading.current_thread().name.rsplit("-", 1)[0])
        return invalidate(self, *args, **kwargs)

    monkeypatch.setattr(CacheStore, "invalidate", recorded)
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    write_policy(tmp_path, "alpha", KEY, fresh_emulator.url, extra="semantic_cache: {enabled: true, semantic: false}\n")
    ask: Any = dict(model="gpt-4o", temperature=0, messages=[{"role": "user", "content": "Name a fjord."}])
    with running_proxy([tmp_path]) as proxy:
        stored = oai(proxy, KEY).chat.completions.with_raw_response.create(**ask)
        key = stored.headers["x-slipstream-cache-key"]
        auth = {"authorization": f"Bearer {KEY}"}
        one = httpx.delete(f"{proxy.url}/v1/slipstream/cache", params={"key": key}, headers=auth, timeout=PATIENCE_S)
        assert oai(proxy, KEY).chat.completions.with_raw_response.create(**ask).headers["x-slipstream-cache"] == "miss"
        every = httpx.delete(f"{proxy.url}/v1/slipstream/cache", headers=auth, timeout=PATIENCE_S)
    assert one.json() == {"removed": 1} and every.json() == {"removed": 1}
    assert ran == ["slipstream-response-cache"] * 2, ran  # before: asyncio's default pool (uvloop_0)
