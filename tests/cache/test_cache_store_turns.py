"""One team's cache stores do not hold another team's answers, through the proxy."""

from __future__ import annotations

import openai

from gateway.testing import running_proxy
from tests.helpers import GatedTurns, skip_without_extra, write_policy

skip_without_extra("semantic")  # the teams' policies turn the response cache on (faiss)

CACHED = "semantic_cache: {enabled: true, semantic: false}\n"


def test_one_teams_many_cache_stores_do_not_hold_another_teams_answer(tmp_path, monkeypatch, fresh_emulator):
    """A whole answer is stored in the response cache before its client gets it, and the store ran in
    asyncio's default thread pool, first come, first served (the pool every `to_thread` caller shares:
    a batch's budget hold without Redis, policy reloads, /metrics). The cache has one writer lock and a store may
    wait on SQLite for another worker's write: a team whose many answers were being stored made another
    team's answer wait until every one of them had been. Here alpha's 20 stores are held (a slow disk)
    until beta's is queued: beta's was stored after 14 or more of alpha's on the old code. Each store is
    now a turn of its team's (sdk/offload.py:FairPool), and beta's comes second."""
    from sdk.cache.response_cache import ResponseCache
    from sdk.cache.store import CacheStore

    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    write_policy(tmp_path, "alpha", "sk-alpha", fresh_emulator.url, extra=CACHED)
    write_policy(tmp_path, "beta", "sk-beta", fresh_emulator.url, extra=CACHED)
    turns = GatedTurns()
    original_put, original_store = ResponseCache.put, CacheStore.put

    async def asking(self, team, *args, **kwargs):
        turns.asked.append(team)
        return await original_put(self, team, *args, **kwargs)

    def slow_disk(self, entry, limits):
        return turns.held(entry.team, lambda: original_store(self, entry, limits))

    monkeypatch.setattr(ResponseCache, "put", asking)
    monkeypatch.setattr(CacheStore, "put", slow_disk)
    with running_proxy([tmp_path], watch_interval_s=None) as proxy:
        alpha = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-alpha", max_retries=0, timeout=60)
        beta = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-beta", max_retries=0, timeout=60)

        def ask(client: openai.OpenAI, text: str) -> str:
            return client.chat.completions.create(model="gpt-4o", temperature=0, messages=[{"role": "user", "content": text}]).id

        turns.race(lambda i: ask(alpha, f"Alpha question {i}?"), lambda: ask(beta, "Beta question?"), 20)
    assert sorted(turns.done) == sorted(["alpha"] * 20 + ["beta"])
    assert turns.done.index("beta") <= 2, turns.done  # after at most two of alpha's (14 or more before)
