"""A client that leaves a stream mid-answer: the engine request is aborted (its KV blocks and batch
place freed at once), and through the gateway's in-process `kind: local` provider the team is charged
the engine's own count of what was generated, not an estimate of the text it was sent. With the
official `openai` client through a real proxy on loopback; what is charged comes from the spend report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.testing import running_proxy
from localengine.engine.async_engine import AsyncLLMEngine, get_shared_engine
from tests.helpers import oai, spend_report, wait_until
from tests.localengine.conftest import engine_server
from tests.localengine.test_server import _finished

KEY = "sk-local-leaves"
# $1 a generated token, prompts free: the day's spend is the output tokens charged
POLICY = f"""team: leaves
api_keys: [{{value: "{KEY}"}}]
providers:
  local: {{kind: local, model: demo}}
routes:
  - targets: [{{provider: local}}]
pricing:
  "demo": {{input: 0, output: 1000000}}
prompt_cache: {{enabled: false}}
semantic_cache: {{enabled: false}}
"""


def _idle(engine: Any) -> bool:  # the LLMEngine
    bm, scheduler = engine.block_manager, engine.scheduler
    return (not engine.has_unfinished_requests() and not scheduler.running and not scheduler.waiting
            and bm.num_free_blocks == bm.num_blocks)


def test_a_client_leaving_mid_stream_aborts_and_is_charged_what_was_generated(tmp_path: Path) -> None:
    (tmp_path / "leaves.yaml").write_text(POLICY)
    with running_proxy([tmp_path / "leaves.yaml"]) as proxy:
        client = oai(proxy, KEY)
        received = 0
        with client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "def main("}],
                                            max_tokens=1500, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True}) as stream:
            for chunk in stream:
                received += sum(1 for c in chunk.choices if c.delta.content)
                if received >= 8:
                    break  # the client leaves: the openai client closes the connection
        engine = get_shared_engine("demo").engine  # the one the provider runs, in this process
        wait_until(lambda: _idle(engine), "the engine request aborted and its KV blocks and place freed")
        day = wait_until(lambda: (d := spend_report(proxy, KEY)["day"])["total"] > 0 and d, "the stream's charge")
        charged = round(float(day["total"]))
        # The engine's count (at least one token a content chunk, short of the 1,500 asked: it was aborted),
        # not the gateway's estimate from the text the client was sent.
        assert received <= charged < 1500
        assert float(day["estimated"]) == 0.0


@pytest.mark.parametrize("chat", [False, True])
def test_engine_serve_aborts_every_choice_of_a_stream_its_client_left(llama_dir, chat: bool) -> None:
    """`slipstream engine serve`, n=2 (two engine requests), chat and legacy completions: both are aborted
    at once, their KV blocks, batch places and the async engine's streams let go."""
    engine = AsyncLLMEngine.from_args(str(llama_dir), dtype="float32", block_size=4, max_model_len=512,
                                      num_kvcache_blocks=256)
    try:
        with engine_server(engine, "tiny") as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            kw: dict[str, Any] = dict(model="tiny", max_tokens=480, n=2, stream=True, extra_body={"ignore_eos": True})
            stream: Any = (client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], **kw) if chat
                           else client.completions.create(prompt="def add(a, b):", **kw))
            with stream:
                for seen, _ in enumerate(stream):
                    if seen == 6:
                        break
            wait_until(lambda: _idle(engine.engine) and not engine._streams, "both choices aborted and freed")
            assert _finished(url, "length") == 0  # aborted, neither generated to max_tokens
    finally:
        engine.shutdown()
