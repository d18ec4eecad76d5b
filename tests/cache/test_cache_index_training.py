"""A team's partition switching to an approximate index does not hold every team's lookups.

Through the proxy with the official openai client, the emulator as the upstream. A response-cache
partition that grows past `approximate_from` entries (20,000) gets an approximate (IVF) index, trained by
k-means over every vector: seconds (2.6 s for 20,000 on a 2-core machine). It was trained inside the
store, holding the lock every lookup takes, and lookups run on the event loop every team's requests
share: while one team's 20,000th answer was stored, no team's request moved. It is trained holding no
lock now, in the heavy-work pool as its team's work, and installed with what was stored meanwhile.
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from tests.helpers import PATIENCE_S, skip_without_extra, wait_until, write_policy

skip_without_extra("semantic")  # the response cache's index is faiss

import faiss  # noqa: E402

from sdk.cache import response_cache  # noqa: E402

CACHED = "semantic_cache: {enabled: true}\n"
GROWN = 40  # entries before a partition is approximate, for the test (20,000 in the gateway)


def _ask(client: openai.OpenAI, text: str) -> str:
    answer = client.chat.completions.create(model="gpt-4o", temperature=0, messages=[{"role": "user", "content": text}])
    return answer.choices[0].message.content or ""


def test_training_a_teams_approximate_index_does_not_hold_another_teams_request(tmp_path: Path, monkeypatch,
                                                                                fresh_emulator: RunningEmulator) -> None:
    """alpha's 40th answer makes its partition approximate; the training is held (seconds of k-means) until
    beta has been answered: on the old code beta's lookup waited for the store's lock on the event loop,
    and beta was not answered while it was held."""
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(response_cache, "ResponseCache", functools.partial(response_cache.ResponseCache, approximate_from=GROWN))
    training, gate = threading.Event(), threading.Event()

    class HeldTraining(faiss.IndexIVFFlat):  # type: ignore[misc]
        def train(self, x):  # type: ignore[no-untyped-def]
            training.set()
            gate.wait(PATIENCE_S)
            return super().train(x)

    monkeypatch.setattr(faiss, "IndexIVFFlat", HeldTraining)
    write_policy(tmp_path, "alpha", "sk-alpha-grown", fresh_emulator.url, extra=CACHED)
    write_policy(tmp_path, "beta", "sk-beta-grown", fresh_emulator.url, extra=CACHED)
    with running_proxy([tmp_path], watch_interval_s=None) as proxy:
        alpha = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-alpha-grown", max_retries=0, timeout=60)
        beta = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-beta-grown", max_retries=0, timeout=60)
        for i in range(GROWN - 1):
            _ask(alpha, f"What is fact number {i} about the river delta?")
        with ThreadPoolExecutor(2) as pool:
            try:
                last = pool.submit(_ask, alpha, f"What is fact number {GROWN} about the river delta?")
                wait_until(training.is_set, "alpha's partition began its training")
                answered = pool.submit(_ask, beta, "Which river feeds the delta?")
                wait_until(answered.done, "beta answered while alpha's index trains")  # before: not while it was held
                assert answered.result()
            finally:
                gate.set()
            assert last.result()
        store = proxy.app.state.registry.services.response_cache().store
        index = store._teams["alpha"].partitions
        wait_until(lambda: all(partition.approximate for partition in index.values()), "alpha's index installed")
        assert _ask(alpha, "What is fact number 3 about the river delta?")  # answered with it in place


def test_entries_stored_and_removed_during_the_training_are_brought_in() -> None:
    """The index is trained on a snapshot; what was added and removed meanwhile is applied when it is installed."""
    import numpy as np

    from sdk.cache.index import PartitionIndex
    from sdk.embedding import DIMENSION

    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((GROWN + 1, DIMENSION)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index = PartitionIndex(GROWN)
    index.add(list(range(GROWN)), vectors[:GROWN])
    assert index.due
    snapshot = index.snapshot()
    index.add([GROWN], vectors[GROWN:])  # stored while it trains
    index.remove([0])  # evicted while it trains
    index.install(PartitionIndex.trained(snapshot), snapshot)
    assert index.approximate and not index.due
    assert index.search(vectors[GROWN], 1)[0][0] == GROWN
    assert all(entry_id != 0 for entry_id, _ in index.search(vectors[0], 4))
