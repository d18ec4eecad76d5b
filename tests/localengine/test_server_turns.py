"""The engine server reads one tenant's large bodies in turn with another's.

Reading a body of a few MiB (JSON, the chat template, the tokenizer) takes seconds, so the server does
it in a thread: asyncio's default pool, first come, first served. One tenant's queue of large requests
(every team's, through the gateway: one client address) held another tenant's until all of it had run.
The tenants take turns in a pool of their own now; the gateway names its team in a header.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from gateway.testing import running_proxy
from localengine import server
from localengine.engine.async_engine import AsyncLLMEngine
from sdk.providers.local import team_cache_salt
from tests.helpers import PATIENCE_S, wait_until
from tests.localengine.conftest import engine_server


def _body(word: str) -> bytes:  # 300 KB and more: past the server's LARGE_BODY_BYTES, read in a thread
    return orjson.dumps({"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": (word + " ") * 60_000}]})


@pytest.fixture(scope="module")
def engine(llama_dir) -> Iterator[AsyncLLMEngine]:
    engine = AsyncLLMEngine.from_args(str(llama_dir), dtype="float32", block_size=4, max_model_len=128, num_kvcache_blocks=64)
    yield engine
    engine.shutdown()


def test_one_tenants_queue_of_large_bodies_does_not_hold_another_tenants(engine, monkeypatch):
    started: list[str] = []  # whose body each read was, in the order they began
    gate = threading.Event()
    parse = server.EngineApp._parse

    def gated(self, path: str, raw: bytes):
        started.append("beta" if b'"beta ' in raw[:200] else "alpha")
        if started[-1] == "alpha":
            gate.wait(PATIENCE_S)
        return parse(self, path, raw)

    monkeypatch.setattr(server.EngineApp, "_parse", gated)
    with engine_server(engine, "tiny") as url:
        def post(word: str) -> int:
            return httpx.post(url + "/v1/chat/completions", content=_body(word), timeout=120,
                              headers={"content-type": "application/json", "x-engine-tenant": word}).status_code

        alphas = [threading.Thread(target=post, args=("alpha",)) for _ in range(10)]
        for thread in alphas:
            thread.start()
        wait_until(lambda: len(started) >= 2 and server._READER.waiting().get("h:alpha", 0) >= 8, "alpha's reads queued")
        beta = threading.Thread(target=post, args=("beta",))
        beta.start()
        wait_until(lambda: "h:beta" in server._READER.waiting() or "beta" in started, "beta's read queued")
        gate.set()
        for thread in [*alphas, beta]:
            thread.join()
    # The pool's two threads held two of alpha's; once they were free, alpha's turn (it waited first) and
    # beta's. First come, first served: after all ten.
    assert started.index("beta") <= 3, started


def test_the_gateway_names_its_team_to_its_engine(engine, monkeypatch, tmp_path: Path):
    tenants: list[str] = []
    tenant = server._tenant

    def recorded(scope):
        tenants.append(tenant(scope))
        return tenants[-1]

    monkeypatch.setattr(server, "_tenant", recorded)
    with engine_server(engine, "tiny") as url:
        for team in ("alpha", "beta"):
            (tmp_path / f"{team}.yaml").write_text(f"""team: {team}
api_keys: [{{value: "sk-{team}"}}]
providers:
  engine: {{kind: local, base_url: "{url}/v1", model: tiny}}
routes:
  - targets: [{{provider: engine}}]
retry: {{max_attempts: 1}}
prompt_cache: {{enabled: false}}
""")
        with running_proxy([tmp_path], watch_interval_s=None) as proxy:
            for team in ("alpha", "beta"):
                answer = httpx.post(proxy.url + "/v1/chat/completions", content=_body(team), timeout=120,
                                    headers={"authorization": f"Bearer sk-{team}", "content-type": "application/json"})
                assert answer.status_code == 400  # past the tiny model's context, read in the pool first
    assert tenants == [f"h:{team_cache_salt('alpha')}", f"h:{team_cache_salt('beta')}"]


async def test_a_body_in_many_pieces_is_joined_once():
    """The server added each piece of a body to the bytes so far, copying them all again: a 32 MiB body
    in 64 KiB pieces was about 8 GiB copied on the loop every client shares. It is joined once now."""
    copied = [0]

    class Piece(bytes):
        def __radd__(self, other: bytes) -> bytes:  # `so_far + piece`: the copy of everything so far
            copied[0] += len(other)
            return bytes(other) + bytes(self)

    messages = iter([{"type": "http.request", "body": Piece(b"x" * 65536), "more_body": i < 63} for i in range(64)])

    async def receive() -> dict:
        return next(messages)

    body = await server._read_body(receive)
    assert body == b"x" * (64 * 65536)
    assert copied[0] == 0  # 132,120,576 bytes (63 pieces' worth of re-copies) before
