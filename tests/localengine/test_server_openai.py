"""`slipstream engine serve` as strict as vLLM's OpenAI server, and its `/v1/completions`, driven by
the official `openai` client (and raw HTTP where the client would not send the request)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from localengine.engine.async_engine import AsyncLLMEngine
from tests.localengine.conftest import engine_server

MESSAGES = [{"role": "user", "content": "def add(a, b):"}]


@pytest.fixture(scope="module")
def engine(llama_dir) -> Iterator[AsyncLLMEngine]:
    engine = AsyncLLMEngine.from_args(str(llama_dir), dtype="float32", block_size=4, max_model_len=128,
                                      num_kvcache_blocks=256)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def url(engine) -> Iterator[str]:
    with engine_server(engine, "tiny") as url:
        yield url


@pytest.fixture
def client(url) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("extra, param", [
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
    ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),  # without tools
    ({"stop_token_ids": [100000]}, "stop_token_ids"),
    ({"seed": 2**63}, "seed"),
    ({"max_tokens": 200}, "max_tokens"),  # prompt + completion past the 128-token context
    ({"guided_json": {"type": "object"}}, "guided_json"),
    ({"prompt_logprobs": 1}, "prompt_logprobs"),
    ({"echo": True}, "echo"),
    ({"min_p": 0.1}, "min_p"),
    ({"no_such_field": 1}, "no_such_field"),
])
def test_chat_refuses_what_vllm_refuses(client, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, extra_body=extra)
    assert err.value.status_code == 400 and err.value.param == param
    assert param in err.value.message


@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
    {"type": "file", "file": {"file_id": "file-1"}},
])
def test_a_content_part_the_model_cannot_read_is_refused_not_dropped(client, part):
    """The image (audio, file) was left out of the prompt and the model answered as if it had seen it."""
    content = [{"type": "text", "text": "What is in this?"}, part]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}], max_tokens=2)  # type: ignore[misc, list-item]
    assert err.value.status_code == 400 and err.value.param == "messages" and repr(part["type"]) in err.value.message
    ok = client.chat.completions.create(model="tiny", max_tokens=2, messages=[  # text parts (and a refusal) are read
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},  # type: ignore[list-item]
        {"role": "user", "content": "Hi"}])
    assert ok.choices[0].finish_reason == "length"


def test_fields_that_change_nothing_are_accepted(client):
    res = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, user="u", store=False,
                                         metadata={"k": "v"}, seed=2**63 - 1, extra_body={"logprobs": None})
    assert res.choices[0].message.content is not None


def test_http_level_rules(url):
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 2}
    form = httpx.post(url + "/v1/chat/completions", content=httpx.Request("POST", url, json=body).content,
                      headers={"content-type": "application/x-www-form-urlencoded"})
    assert form.status_code == 415
    missing = httpx.post(url + "/v1/chat/completions", json={k: v for k, v in body.items() if k != "model"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"
    other = httpx.post(url + "/v1/completions", json={"model": "other", "prompt": "x"})
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"
    unknown = httpx.post(url + "/v1/no/such/path", json=body)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] is None
    assert "/v1/no/such/path" in unknown.json()["error"]["message"]
    assert httpx.get(url + "/v1/completions").status_code == 405


def test_chat_n_choices(client):
    res = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, n=3, temperature=1, seed=7,
                                         extra_body={"ignore_eos": True})
    assert [c.index for c in res.choices] == [0, 1, 2]
    assert res.usage is not None and res.usage.completion_tokens == 15
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, n=2, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True})
    text = {0: "", 1: ""}
    finished = set()
    for chunk in stream:
        for choice in chunk.choices:
            text[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished.add(choice.index)
    assert finished == {0, 1} and text[0] == text[1]  # greedy: the same answer twice


def test_completions(client):
    plain = client.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=6, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert plain.object == "text_completion" and plain.choices[0].finish_reason == "length"
    assert plain.usage is not None and plain.usage.completion_tokens == 6
    # Token ids, several prompts, n choices each: OpenAI's numbering, prompt-major.
    batch = client.completions.create(model="tiny", prompt=[[5, 6, 7], [8, 9]], max_tokens=3, n=2, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.usage is not None and batch.usage.prompt_tokens == 5 and batch.usage.completion_tokens == 12
    echoed = client.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=6, temperature=0, echo=True,
                                       extra_body={"ignore_eos": True})
    assert echoed.choices[0].text == "def add(a, b):" + plain.choices[0].text
    scored = client.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=4, temperature=0, logprobs=3,
                                       extra_body={"ignore_eos": True})
    lp = scored.choices[0].logprobs
    # Keyed by text, as OpenAI's legacy shape is: byte tokens that decode alike share a key.
    assert lp is not None and len(lp.tokens or []) == 4 and all(1 <= len(t) <= 3 for t in lp.top_logprobs or [])
    # Where each token starts in the text (bytes of one character start where it does: test_completion_offsets.py)
    assert lp.text_offset is not None and lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert lp.text_offset[-1] <= len(scored.choices[0].text)
    stopped = client.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=30, temperature=0,
                                        stop=[plain.choices[0].text[2:4]], extra_body={"ignore_eos": True})
    assert stopped.choices[0].finish_reason == "stop"


def test_completions_stream_matches(client):
    whole = client.completions.create(model="tiny", prompt="The quick", max_tokens=6, temperature=0,
                                      extra_body={"ignore_eos": True})
    chunks = list(client.completions.create(model="tiny", prompt="The quick", max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


@pytest.mark.parametrize("extra, param", [
    ({"suffix": "return a"}, "suffix"),
    ({"echo": True, "logprobs": 1}, "echo"),
    ({"logprobs": 21}, "logprobs"),
    ({"best_of": 3}, "best_of"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[1, 100000]]}, "prompt"),
])
def test_completions_refuse(url, extra, param):
    res = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2, **extra})
    assert res.status_code == 400 and res.json()["error"]["param"] == param, res.text


# --- what vLLM's own server tests ask (bench/vllm_compat runs them; these hold it in the suite) -------------


def test_chat_stream_ends_its_text_with_the_finish_reason_and_reports_usage_on_every_chunk(client):
    """vLLM sends a choice's last text in the chunk that carries finish_reason, and with
    continuous_usage_stats every chunk carries the usage so far."""
    chunks = list(client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True, "min_tokens": 5}))
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason is not None]
    assert len(finishing) == 1 and finishing[0].choices[0].finish_reason == "length"
    assert finishing[0].choices[0].delta.content  # the last text rides with the finish reason
    counts = [c.usage.completion_tokens for c in chunks if c.usage is not None]
    assert len(counts) == len(chunks) and counts[0] == 0 and counts[-1] == 5
    with_text = [c.usage.completion_tokens for c in chunks[1:-1] if c.usage is not None]
    assert with_text == sorted(set(with_text))  # strictly growing while tokens arrive
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 5


def test_completions_logprobs_zero_gives_the_sampled_token_and_prompt_logprobs_is_null(client, url):
    res = client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=3, temperature=0, logprobs=0,
                                    extra_body={"ignore_eos": True})
    lp = res.choices[0].logprobs
    assert lp is not None and lp.top_logprobs is not None and lp.tokens is not None
    assert [list(top) for top in lp.top_logprobs] == [[t] for t in lp.tokens]  # vLLM: top k plus the sampled one
    assert res.choices[0].model_extra == {"prompt_logprobs": None}
    chat = httpx.post(url + "/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "max_tokens": 1})
    assert "prompt_logprobs" in chat.json() and chat.json()["prompt_logprobs"] is None


@pytest.mark.parametrize("seed, bound", [(-2**63 - 1, "greater_than_equal"), (2**63, "less_than_equal")])
def test_a_seed_past_64_bits_is_refused_in_vllms_words(client, seed, bound):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, seed=seed)
    assert err.value.param == "seed" and bound in err.value.message


def test_invocations_answers_as_the_endpoint_the_body_is_for(url):
    chat = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    text = {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    for body, path in ((chat, "/v1/chat/completions"), (text, "/v1/completions")):
        direct, invoked = httpx.post(url + path, json=body).json(), httpx.post(url + "/invocations", json=body).json()
        assert invoked["object"] == direct["object"] and invoked["choices"] == direct["choices"]


def test_completions_truncate_the_prompt_and_return_token_ids(client):
    ids = list(range(8, 16))
    for side, kept in (("right", ids[:4]), ("left", ids[-4:]), (None, ids[-4:])):
        res = client.completions.create(model="tiny", prompt=ids, max_tokens=3, temperature=0, extra_body={
            "return_token_ids": True, "truncate_prompt_tokens": 4, "truncation_side": side, "ignore_eos": True})
        extra = res.choices[0].model_extra or {}
        assert extra["prompt_token_ids"] == kept and len(extra["token_ids"]) == 3
        assert res.usage is not None and res.usage.prompt_tokens == 4
    stream = client.completions.create(model="tiny", prompt=ids, max_tokens=3, temperature=0, stream=True,
                                       extra_body={"return_token_ids": True, "ignore_eos": True})
    chunks = [c.choices[0].model_extra or {} for c in stream]
    assert chunks[0]["prompt_token_ids"] == ids and all("prompt_token_ids" not in c for c in chunks[1:])
    assert len([t for c in chunks for t in c["token_ids"]]) == 3
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt=ids, max_tokens=3, extra_body={"truncate_prompt_tokens": 0})
    assert err.value.param == "truncate_prompt_tokens"


def test_engine_serve_takes_vllms_serving_flags(monkeypatch):
    import localengine.server
    from gateway.cli import main

    seen: dict = {}
    monkeypatch.setattr(localengine.server, "serve", lambda model, **kwargs: seen.update(model=model, **kwargs))
    assert main(["engine", "serve", "--model", "demo", "--served-model-name", "org/name", "--max-num-seqs", "4",
                 "--max-num-batched-tokens", "256", "--no-enable-prefix-caching", "--override-generation-config", '{"max_new_tokens": 7}']) == 0
    assert seen["model"] == "demo" and seen["served_model_name"] == "org/name" and seen["default_max_tokens"] == 7
    assert seen["max_num_seqs"] == 4 and seen["max_num_batched_tokens"] == 256 and seen["enable_prefix_caching"] is False
    assert main(["engine", "serve", "--model", "demo", "--override-generation-config", '{"temperature": 0}']) == 2


def test_a_chat_request_without_max_tokens_gets_the_servers_default(engine):
    from localengine.serving_chat import parse_chat_request

    body = {"model": "tiny", "messages": MESSAGES}
    assert parse_chat_request(body, engine, "tiny", default_max_tokens=7).params.max_tokens == 7
    assert parse_chat_request({**body, "max_tokens": 9}, engine, "tiny", default_max_tokens=7).params.max_tokens == 9
    unset = parse_chat_request(body, engine, "tiny").params.max_tokens  # vLLM's: up to the context
    assert unset == 128 - len(parse_chat_request(body, engine, "tiny").prompt_token_ids)


def test_bad_requests_are_worded_as_vllms(client):
    """vLLM's tests match these words: every bad logit_bias key named at once, out-of-vocabulary
    prompt ids, a missing prompt."""
    with pytest.raises(openai.BadRequestError) as bias:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, logit_bias={"bad1": 5, "bad2": 1})
    assert "bad1" in bias.value.message and "bad2" in bias.value.message and bias.value.param == "logit_bias"
    with pytest.raises(openai.BadRequestError, match="out of vocabulary"):
        client.completions.create(model="tiny", prompt=[999999], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="Either prompt or prompt_embeds must be provided and non-empty"):
        client.completions.create(model="tiny", prompt=None, max_tokens=2, extra_body={"prompt_embeds": []})
