"""A client that leaves a stream mid-answer: the engine request is aborted (its KV blocks and batch
place freed at once), and through the gateway's in-process `kind: local` provider the team is charged
the engine's own count of what was generated, not an estimate of the text it was sent. With the
official `openai` client through a real proxy on loopback; what is charged comes from the spend report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.testing import running_proxy
from localengine.engine.async_engine import get_shared_engine
from tests.helpers import oai, spend_report, wait_until

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
