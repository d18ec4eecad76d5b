"""`/v1/embeddings` (bundled MiniLM, exact per-item cache), `/v1/models`, and provider-shaped 404/405,
through the proxy with the official clients and LangChain, and through the drop-in SDK."""

from __future__ import annotations

from pathlib import Path

import anthropic
import httpx
import numpy as np
import openai
import pytest

import sdk
from tests.helpers import requires_extra, write_policy

# Every team here serves MiniLM from the in-process local provider.
pytestmark = requires_extra("engine", "semantic")

KEY_A, KEY_B = "sk-emb-a", "sk-emb-b"
MINILM = "all-minilm-l6-v2"
LOCAL = f"""  - match: {{model: "{MINILM}"}}
    targets: [{{provider: local}}]
"""


def _policy(directory: Path, team: str, key: str, emulator_url: str) -> Path:
    path = write_policy(directory, team, key, emulator_url, extra="prompt_cache: {enabled: false}\n")
    text = path.read_text().replace("providers:\n", "providers:\n  local: {kind: local, model: demo}\n")
    path.write_text(text.replace("routes:\n", "routes:\n" + LOCAL))
    return path


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory, emulator) -> Path:
    directory = tmp_path_factory.mktemp("embedding-policies")
    _policy(directory, "emb-a", KEY_A, emulator.url)
    _policy(directory, "emb-b", KEY_B, emulator.url)
    return directory


@pytest.fixture(scope="module")
def minilm():
    from sdk.embedding import Embedder

    return Embedder()


def _vectors(response) -> np.ndarray:
    return np.array([item.embedding for item in response.data], dtype=np.float32)


def test_local_embeddings_with_exact_per_item_cache(proxy, minilm):
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY_A, max_retries=0)
    texts = ["How do I reset my password?", "The fjord is deep and cold.", "How can I change my password?"]
    raw = client.embeddings.with_raw_response.create(model=MINILM, input=texts)  # the client asks for base64
    first = raw.parse()
    vectors = _vectors(first)
    assert vectors.shape == (3, 384) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert np.allclose(vectors, minilm.embed_many(texts), atol=1e-5)  # what the model itself computes
    assert vectors[0] @ vectors[2] > 0.7 > vectors[0] @ vectors[1]
    billed = first.usage.prompt_tokens
    assert billed == first.usage.total_tokens > len(texts)
    assert raw.headers["x-slipstream-cache"] == "miss" and raw.headers["x-slipstream-route"] == f"local/{MINILM}"
    assert raw.headers["x-slipstream-embedding-cache"] == "hits=0;misses=3"

    again = client.embeddings.with_raw_response.create(model=MINILM, input=texts)
    assert again.headers["x-slipstream-cache"] == "exact-hit" and again.headers["x-slipstream-route"] == f"cache/local/{MINILM}"
    assert np.array_equal(_vectors(again.parse()), vectors) and again.parse().usage.prompt_tokens == 0

    # A batch with one new item: only that one is embedded (and billed), the answer keeps the client's order.
    new = "Where is the nearest train station?"
    mixed = client.embeddings.with_raw_response.create(model=MINILM, input=[texts[1], new, texts[0], new])
    assert mixed.headers["x-slipstream-embedding-cache"] == "hits=2;misses=2"
    result = mixed.parse()
    assert [item.index for item in result.data] == [0, 1, 2, 3]
    got = _vectors(result)
    assert np.array_equal(got[0], vectors[1]) and np.array_equal(got[2], vectors[0]) and np.array_equal(got[1], got[3])
    alone = client.embeddings.create(model=MINILM, input=new, encoding_format="float")
    assert result.usage.prompt_tokens == alone.usage.prompt_tokens  # the new item once, nothing else
    assert np.allclose(_vectors(alone)[0], got[1], atol=1e-6)

    # Another team never sees team A's vectors.
    other = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY_B, max_retries=0)
    assert other.embeddings.with_raw_response.create(model=MINILM, input=texts).headers["x-slipstream-cache"] == "miss"


def test_embedding_errors_are_provider_shaped(proxy):
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY_A, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model=MINILM, input="hello", dimensions=64)
    with pytest.raises(openai.BadRequestError, match="input"):
        client.embeddings.create(model=MINILM, input=[])
    with pytest.raises(openai.BadRequestError, match="takes text"):
        client.embeddings.create(model=MINILM, input=[[1, 2, 3]])


def test_langchain_embeddings_through_proxy_and_sdk(proxy, policy_dir, minilm):
    from langchain_openai import OpenAIEmbeddings

    docs = ["Paris is the capital of France.", "Bergen gets a lot of rain."]
    # check_embedding_ctx_length=False: send the texts themselves (LangChain would otherwise send
    # tiktoken ids, which only OpenAI's own models read).
    through_proxy = OpenAIEmbeddings(model=MINILM, base_url=f"{proxy.url}/v1", api_key=KEY_A, check_embedding_ctx_length=False)
    expected = minilm.embed_many(docs)
    assert np.allclose(np.array(through_proxy.embed_documents(docs)), expected, atol=1e-5)
    assert np.allclose(through_proxy.embed_query(docs[0]), expected[0], atol=1e-5)

    policy = policy_dir / "emb-a.yaml"
    in_process = OpenAIEmbeddings(model=MINILM, client=sdk.OpenAI(policy=policy).embeddings,
                                  async_client=sdk.AsyncOpenAI(policy=policy).embeddings, check_embedding_ctx_length=False)
    assert np.allclose(np.array(in_process.embed_documents(docs)), expected, atol=1e-5)


async def test_sdk_embeddings_and_models(policy_dir, minilm):
    client = sdk.AsyncOpenAI(policy=policy_dir / "emb-a.yaml")
    try:
        response = await client.embeddings.create(model=MINILM, input=["one", "two"], encoding_format="float")
        assert np.allclose(_vectors(response), minilm.embed_many(["one", "two"]), atol=1e-5)
        ids = [model.id async for model in client.models.list()]
        assert MINILM in ids and "gpt-4o" in ids
        assert (await client.models.retrieve(MINILM)).id == MINILM
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("no-such-model")
    finally:
        await client.close()


def test_models_list_and_retrieve_in_both_shapes(proxy):
    oa = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY_A, max_retries=0)
    listed = {model.id: model for model in oa.models.list()}
    # The literal route, plus the emulator's own list filtered by the glob routes (gpt-*, claude-*).
    assert MINILM in listed and "gpt-4o-mini" in listed and all(m == MINILM or m.startswith(("gpt-", "claude-")) for m in listed)
    assert listed["gpt-4o-mini"].owned_by == "gpt"
    assert oa.models.retrieve("gpt-4o-mini").id == "gpt-4o-mini"
    with pytest.raises(openai.NotFoundError) as missing:
        oa.models.retrieve("gpt-0")
    assert missing.value.body["code"] == "model_not_found"

    an = anthropic.Anthropic(base_url=proxy.url, api_key=KEY_A, max_retries=0)
    page = an.models.list(limit=1)
    assert len(page.data) == 1 and page.has_more
    everything = [model.id for model in an.models.list(limit=2)]  # follows after_id to the end
    assert everything == list(listed)
    assert an.models.retrieve(MINILM).display_name == MINILM
    with pytest.raises(anthropic.NotFoundError) as missing_a:
        an.models.retrieve("claude-0")
    assert missing_a.value.body["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/v1/nothing-here", 404), ("POST", "/v2/chat/completions", 404), ("GET", "/v1/chat/completions", 405),
     ("DELETE", "/v1/embeddings", 405), ("POST", "/v1/models", 405)],
)
def test_unknown_paths_and_methods_are_provider_shaped_after_auth(proxy, method, path, status):
    url = proxy.url + path
    unauthenticated = httpx.request(method, url)
    assert unauthenticated.status_code == 401 and unauthenticated.json()["error"]["code"] == "invalid_api_key"
    answer = httpx.request(method, url, headers={"authorization": f"Bearer {KEY_A}"})
    assert answer.status_code == status and path in answer.json()["error"]["message"]
    if path in ("/v1/chat/completions", "/v1/embeddings"):
        return  # an OpenAI endpoint answers in OpenAI's shape whoever asks
    anthropic_shaped = httpx.request(method, url, headers={"x-api-key": KEY_A, "anthropic-version": "2023-06-01"})
    assert anthropic_shaped.status_code == status
    body = anthropic_shaped.json()
    assert body["type"] == "error" and body["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
