"""The embedding cache reads and writes a large answer's vectors off the event loop.

Through the proxy with the official openai client, the emulator as the upstream. `/v1/embeddings`
answers are large for small requests: 2,048 inputs of one word ask for 2,048 vectors, up to 3,072
floats each, about 67 MB of JSON that took a second to read. The embedding cache (on by default)
read every answer's vectors and wrote the answer again on the event loop every team's requests share,
so one team's few-kilobyte requests held every other team's requests for seconds. An answer of
256 KiB or more (LARGE_BYTES) is read and written in the heavy-work pool now, as its team's work.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk.cache import embedding_stage
from sdk.offload import LARGE_BYTES, TENANT
from tests.helpers import oai, write_policy

KEY = "sk-alpha-vectors"
ROUTE = '  - match: {model: "text-embedding-*"}\n    targets: [{provider: gpt}]\nprompt_cache: {enabled: false}\n'
WORDS = [f"word {i}" for i in range(24)]  # 20 vectors of 3,072 floats, in base64 as the openai client asks: 330 KB


def test_a_large_embeddings_answer_is_read_and_written_in_the_heavy_work_pool(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                                              monkeypatch) -> None:
    """A miss (the upstream's answer read for its vectors), a partial hit (the answer written from the
    cached and the new vectors) and a whole hit (written from the cache alone): each ran on the loop's
    thread before, in the heavy-work pool as alpha's work now. A small answer (the partial hit's four
    new vectors) is still read where it is: a thread hop costs more."""
    ran: list[tuple[str, str, str, bool]] = []
    read, written = embedding_stage._vectors, embedding_stage._body

    def where(step: str, size: int) -> None:
        ran.append((step, threading.current_thread().name.rsplit("-", 1)[0], TENANT.get(), size >= LARGE_BYTES))

    def recorded_read(raw: bytes, expected: int) -> Any:
        where("read", len(raw))
        return read(raw, expected)

    def recorded_write(*args: Any) -> bytes:
        body = written(*args)
        where("write", len(body))
        return body

    monkeypatch.setattr(embedding_stage, "_vectors", recorded_read)
    monkeypatch.setattr(embedding_stage, "_body", recorded_write)
    write_policy(tmp_path, "alpha", KEY, fresh_emulator.url, extra=ROUTE)
    with running_proxy([tmp_path]) as proxy:
        client = oai(proxy, KEY)
        first = client.embeddings.create(model="text-embedding-3-large", input=WORDS[:20])  # a miss
        more = client.embeddings.create(model="text-embedding-3-large", input=WORDS)  # 20 cached, 4 new
        again = client.embeddings.create(model="text-embedding-3-large", input=WORDS)  # all cached
    assert [item.embedding for item in more.data[:20]] == [item.embedding for item in first.data]
    assert [item.embedding for item in again.data] == [item.embedding for item in more.data]
    heavy = ("slipstream-heavy", "alpha", True)
    assert ran[0] == ("read", *heavy)  # before: on the event loop's thread (uvicorn's)
    assert ran[1][0] == "read" and ran[1][1] != "slipstream-heavy" and not ran[1][3]  # the 4 new vectors: small, read in place
    assert ran[2:] == [("write", *heavy), ("write", *heavy)]  # before: on the event loop's thread
