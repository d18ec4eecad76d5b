"""Files, batches, message batches, legacy completions and upstream embeddings with the official
clients, through the proxy and through the drop-in SDK, against the emulator."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import openai
import orjson
import pytest

import sdk
from gateway.testing import RunningServer, running_proxy
from tests.helpers import write_policy

KEY = "sk-pass-clients"
BATCH_LINE = {"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}}


@pytest.fixture(scope="module")
def policy(tmp_path_factory, emulator):
    embeddings_route = "  - match: {model: 'text-embedding-*'}\n    targets: [{provider: gpt}]\n"  # appended to routes
    return write_policy(tmp_path_factory.mktemp("pass-clients"), "passclients", KEY, emulator.url,
                        extra=embeddings_route + "prompt_cache: {enabled: false}\n")


@pytest.fixture(scope="module")
def proxy(policy) -> Iterator[RunningServer]:
    with running_proxy([policy]) as running:
        yield running


def _openai_clients(proxy, policy):
    return [openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0), sdk.OpenAI(policy=policy, max_retries=0)]


def test_files_and_batches_with_the_official_openai_client(proxy, policy, fresh_emulator):
    for client in _openai_clients(proxy, policy):
        upload = client.files.create(file=("batch.jsonl", json.dumps(BATCH_LINE).encode() + b"\n"), purpose="batch")
        assert upload.purpose == "batch" and upload.bytes > 0
        assert client.files.retrieve(upload.id).id == upload.id
        assert json.loads(client.files.content(upload.id).read())["custom_id"] == "q1"
        assert upload.id in [f.id for f in client.files.list()]
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
        assert client.batches.retrieve(batch.id).input_file_id == upload.id
    sent = [r for r in fresh_emulator.app.state.recent if r["path"] == "/v1/files" and r["method"] == "POST"]
    assert len(sent) == 2 and all(dict(r["headers"]).get("authorization") == "Bearer up-openai" for r in sent)


def test_legacy_completions_with_the_official_openai_client(proxy, policy):
    for client in _openai_clients(proxy, policy):
        raw = client.completions.with_raw_response.create(model="gpt-3.5-turbo-instruct", prompt="Once upon a time", max_tokens=8)
        assert raw.parse().choices[0].text and raw.headers["x-slipstream-route"] == "gpt/completions"
        streamed = list(client.completions.create(model="gpt-3.5-turbo-instruct", prompt="Once upon a time", max_tokens=8, stream=True))
        assert len(streamed) > 1


def test_message_batches_with_the_official_anthropic_client(proxy, policy):
    clients = [anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0), sdk.Anthropic(policy=policy, max_retries=0)]
    for client in clients:
        batch = client.messages.batches.create(requests=[{"custom_id": "a", "params": {
            "model": "claude-sonnet-4-6", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}}])
        assert client.messages.batches.retrieve(batch.id).id == batch.id
        assert batch.id in [b.id for b in client.messages.batches.list()]


def test_upstream_embeddings_send_only_uncached_items(proxy, policy, fresh_emulator):
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    first = client.embeddings.create(model="text-embedding-3-small", input=["alpha", "beta"], dimensions=64)
    assert len(first.data[0].embedding) == 64 and first.usage.prompt_tokens > 0
    mixed = client.embeddings.with_raw_response.create(model="text-embedding-3-small", input=["beta", "gamma"], dimensions=64)
    assert mixed.headers["x-slipstream-embedding-cache"] == "hits=1;misses=1"
    assert mixed.parse().data[0].embedding == first.data[1].embedding
    bodies = [orjson.loads(r["body"]) for r in fresh_emulator.app.state.recent if r["path"] == "/v1/embeddings"]
    assert [b["input"] for b in bodies] == [["alpha", "beta"], ["gamma"]]  # beta went upstream once
