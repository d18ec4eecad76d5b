"""The OpenAI-compatible server on loopback, driven by the official `openai` client."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from localengine.engine.async_engine import AsyncLLMEngine
from tests.helpers import wait_until
from tests.localengine.conftest import engine_server


@pytest.fixture(scope="module")
def server(llama_dir) -> Iterator[tuple[str, AsyncLLMEngine]]:
    engine = AsyncLLMEngine.from_args(str(llama_dir), dtype="float32", block_size=4, max_model_len=256,
                                      num_kvcache_blocks=128)
    with engine_server(engine, "tiny") as url:
        yield url, engine
    engine.shutdown()


@pytest.fixture
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused")


MESSAGES = [{"role": "user", "content": "def add(a, b):"}]


def test_chat_completion(client):
    res = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0,
                                         extra_body={"ignore_eos": True})
    assert res.object == "chat.completion" and res.model == "tiny"
    choice = res.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason == "length"
    assert res.usage.completion_tokens == 6
    assert res.usage.total_tokens == res.usage.prompt_tokens + 6


def test_streaming_matches_non_streaming(client):
    args = dict(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**args).choices[0].message.content
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    # Repeating the prompt hits the prefix cache; usage reports it as OpenAI does.
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_raw_sse_ends_with_done(server):
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 3, "stream": True}
    with httpx.stream("POST", server[0] + "/v1/chat/completions", json=body) as res:
        assert res.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(res.iter_bytes())
    assert raw.endswith(b"data: [DONE]\n\n")


def test_models_metrics_and_errors(client, server):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[])
    metrics = httpx.get(server[0] + "/metrics").text
    for name in ("vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:num_preemptions_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket", "vllm:num_requests_running",
                 "vllm:num_requests_waiting"):
        assert name in metrics


def test_client_disconnect_aborts_request(server):
    url, engine = server
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 200, "stream": True, "ignore_eos": True}
    ran_to_the_end = _finished(url, "length")
    with httpx.stream("POST", url + "/v1/chat/completions", json=body) as res:
        next(res.iter_bytes())
    bm = engine.engine.block_manager
    wait_until(lambda: not engine.engine.has_unfinished_requests() and bm.num_free_blocks == bm.num_blocks,
               "the request ended and its KV blocks were freed")
    assert _finished(url, "length") == ran_to_the_end  # aborted, not generated to max_tokens


def _finished(url: str, reason: str) -> float:
    """The engine's count of requests finished for `reason` (vllm:request_success_total on /metrics)."""
    lines = httpx.get(url + "/metrics").text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if line.startswith("vllm:request_success_total{") and f'finished_reason="{reason}"' in line)


async def test_local_provider_over_http(server):
    from sdk.providers.local import LocalProvider
    from sdk.providers.upstream import close_upstream_for_running_loop
    from sdk.types import Endpoint, LLMRequest, LLMResponse, Timings

    provider = LocalProvider("local", "tiny", base_url=server[0] + "/v1")
    request = LLMRequest(Endpoint.CHAT_COMPLETIONS, {"model": "tiny", "messages": MESSAGES, "max_tokens": 4})
    try:
        answer = await provider.send(request, Timings())
    finally:
        await close_upstream_for_running_loop()
    assert isinstance(answer, LLMResponse) and answer.status == 200
    assert answer.usage.output_tokens + answer.usage.cache_read_tokens > 0


def test_a_large_prompt_does_not_hold_the_other_clients(server):
    """The gateway sends every team's requests for a `kind: local` engine served over HTTP to one
    server: reading a body of a few MiB (JSON, the chat template, the tokenizer) ran on its event
    loop for seconds, and no other request was answered meanwhile. Counted in answers, not time."""
    import threading
    import time

    url = server[0]
    large = {"model": "tiny", "max_tokens": 1,
             "messages": [{"role": "user", "content": "def add(a, b): return a + b\n" * (8 * 1024 * 1024 // 29)}]}
    answered: list[tuple[float, float]] = []
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=url) as http:
            while not done.is_set():
                sent = time.perf_counter()
                assert http.get("/v1/models").status_code == 200
                answered.append((sent, time.perf_counter()))

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        started = time.perf_counter()
        refused = httpx.post(url + "/v1/chat/completions", json=large, timeout=300)
        ended = time.perf_counter()
    finally:
        done.set()
        prober.join()
    assert refused.status_code == 400 and "context length" in refused.json()["error"]["message"]
    # Answers to requests sent in the second half of the large one's time in the server: with the
    # reading on the loop, that half was all reading (it ends in the 400), and none were.
    late = [pair for pair in answered if pair[0] > (started + ended) / 2 and pair[1] < ended]
    assert len(late) >= 5, f"{len(late)} other requests answered in the second half of the large one's {ended - started:.1f}s"
