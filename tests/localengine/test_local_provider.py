"""The gateway's `kind: local` provider, in process (shared engine) and over HTTP."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from sdk.errors import SlipstreamError
from sdk.providers.local import LocalProvider
from sdk.types import Endpoint, LLMRequest, LLMResponse, LLMStream, Timings

ENGINE_ARGS = dict(dtype="float32", block_size=4, max_model_len=256, num_kvcache_blocks=64)


def chat(**extra) -> LLMRequest:
    body = {"model": "local-tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5,
            "temperature": 0, "ignore_eos": True, **extra}
    return LLMRequest(Endpoint.CHAT_COMPLETIONS, body)


@pytest.fixture(scope="module")
def provider(llama_dir) -> LocalProvider:
    return LocalProvider("local", str(llama_dir), engine_args=ENGINE_ARGS)


async def test_non_streaming_answer_with_usage(provider):
    answer = await provider.send(chat(), Timings())
    assert isinstance(answer, LLMResponse) and answer.status == 200
    data = orjson.loads(answer.body)
    assert data["object"] == "chat.completion" and data["choices"][0]["finish_reason"] == "length"
    assert answer.usage.output_tokens == 5 and answer.usage.total_input_tokens == data["usage"]["prompt_tokens"]
    # The engine's model answered, whatever the client asked for ("local-tiny"): the labels say so.
    assert answer.route == f"local/{provider.model}" and data["model"] == provider.model


async def test_streaming_events_and_usage(provider):
    timings = Timings()
    answer = await provider.send(chat(stream=True), timings)
    assert isinstance(answer, LLMStream)
    events = [e async for e in answer.events]
    assert events[-1] == b"data: [DONE]\n\n"
    assert all(e.startswith(b"data: ") and e.endswith(b"\n\n") for e in events)
    assert b'"usage"' not in b"".join(events)  # the client did not ask for usage in the stream...
    assert answer.usage.output_tokens == 5  # ...but the pipeline still gets it
    assert timings.first_token is not None


async def test_close_aborts_the_engine_request(provider):
    from localengine.engine.async_engine import get_shared_engine

    answer = await provider.send(chat(stream=True, max_tokens=200), Timings())
    assert isinstance(answer, LLMStream)
    await anext(answer.events)
    await answer.aclose()
    engine = get_shared_engine(provider.model).engine
    for _ in range(500):
        if not engine.has_unfinished_requests():
            break
        await asyncio.sleep(0.01)
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


async def test_anthropic_requests_are_refused(provider):
    request = LLMRequest(Endpoint.MESSAGES, {"model": "x", "messages": [], "max_tokens": 1})
    with pytest.raises(SlipstreamError) as info:
        await provider.send(request, Timings())
    assert info.value.status == 400


async def test_bad_request_is_an_openai_shaped_error(provider):
    with pytest.raises(SlipstreamError) as info:
        await provider.send(chat(logprobs=True, top_logprobs=21), Timings())
    assert info.value.status == 400 and "21" in info.value.message


async def test_missing_model_is_unavailable_so_the_router_fails_over(tmp_path):
    from sdk.errors import ProviderUnavailableError

    with pytest.raises(ProviderUnavailableError, match="cannot load"):
        await LocalProvider("local", str(tmp_path / "nope")).send(chat(), Timings())


async def test_policy_speculative_config_reaches_the_engine(tmp_path):
    """`speculative:` on a local provider builds its own engine with speculation (the shared demo engine is untouched)."""
    import orjson

    from localengine.engine.async_engine import get_shared_engine
    from sdk.policy import Policy
    from sdk.requests import parse_request
    from sdk.runtime import TeamRuntime
    from sdk.types import Endpoint

    policy = Policy.model_validate(
        {
            "team": "spec",
            "providers": {"local": {"kind": "local", "model": "demo", "speculative": {"method": "ngram", "num_speculative_tokens": 3}}},
            "routes": [{"targets": [{"provider": "local"}]}],
            "prompt_cache": {"enabled": False},
        }
    )
    runtime = TeamRuntime.build(policy)
    body = {"model": "demo", "messages": [{"role": "user", "content": "for i in range(3):\n    print(i)\n"}], "max_tokens": 64, "temperature": 0}
    answer, _ = await runtime.handle(parse_request(Endpoint.CHAT_COMPLETIONS, orjson.dumps(body), "", {}))
    assert answer.status == 200 and answer.usage.output_tokens > 0
    # The shared-engine registry is keyed by model and arguments: this is the engine that answered.
    engine = await asyncio.to_thread(get_shared_engine, "demo", speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    stats = engine.engine.spec_decode_stats()
    assert stats is not None and stats.num_drafts > 0


async def test_default_max_tokens_caps_a_request_that_names_none(llama_dir):
    """`default_max_tokens` (policy key of an in-process local provider) bounds an answer whose request
    names no max_tokens; without it such an answer ran to the context (minutes for SmolLM2 on a CPU)."""
    from sdk.policy import ProviderConfig
    from sdk.providers import build_provider

    config = ProviderConfig.model_validate({"kind": "local", "model": str(llama_dir), "default_max_tokens": 3})
    capped = build_provider("local", config)
    assert isinstance(capped, LocalProvider) and capped.default_max_tokens == 3
    capped.engine_args = ENGINE_ARGS
    body = {"model": "x", "messages": [{"role": "user", "content": "hello"}], "temperature": 0, "ignore_eos": True}
    answer = await capped.send(LLMRequest(Endpoint.CHAT_COMPLETIONS, body), Timings())
    assert isinstance(answer, LLMResponse) and answer.usage.output_tokens == 3
    assert orjson.loads(answer.body)["choices"][0]["finish_reason"] == "length"
    answer = await capped.send(LLMRequest(Endpoint.CHAT_COMPLETIONS, {**body, "max_tokens": 5}), Timings())
    assert isinstance(answer, LLMResponse) and answer.usage.output_tokens == 5  # the request's own wins


def test_default_max_tokens_is_refused_where_no_engine_runs_in_process():
    from pydantic import ValidationError

    from sdk.policy import ProviderConfig

    for config in ({"kind": "local", "base_url": "http://127.0.0.1:8000/v1", "default_max_tokens": 8},
                   {"kind": "openai", "default_max_tokens": 8}):
        with pytest.raises(ValidationError, match="in-process local engine"):
            ProviderConfig.model_validate(config)


def test_policy_prompt_lookup_is_for_the_speculator_only():
    from pydantic import ValidationError

    from sdk.policy import ProviderConfig

    spec = {"method": "mlp_speculator", "model": "demo-speculator", "prompt_lookup": True}
    config = ProviderConfig.model_validate({"kind": "local", "model": "demo", "speculative": spec})
    assert config.speculative is not None and config.speculative.model_dump(exclude_none=True)["prompt_lookup"] is True
    with pytest.raises(ValidationError, match="prompt_lookup"):
        ProviderConfig.model_validate({"kind": "local", "model": "demo", "speculative": {"method": "ngram", "prompt_lookup": True}})
