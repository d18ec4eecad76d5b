"""The drop-in clients: the real official SDKs, with the pipeline in process, against the emulator.

Every answer is compared with what the same official client gets talking to the emulator directly.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

import sdk
from emulator.testing import RunningEmulator
from tests.helpers import PATIENCE_S, STALL_MS
from tests.sdk.dropin_helpers import EMU_KEY, slow_stream, write_policy

pytestmark = pytest.mark.timeout(20)

GPT = "gpt-4o-mini"
CLAUDE = "claude-sonnet-4-6"
HELLO = [{"role": "user", "content": "Say hello to the drop-in SDK."}]
WEATHER_TOOL_ANTHROPIC = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
WEATHER_TOOL_OPENAI = {
    "type": "function",
    "function": {"name": WEATHER_TOOL_ANTHROPIC["name"], "description": "Current weather for a city",
                 "parameters": WEATHER_TOOL_ANTHROPIC["input_schema"]},
}
# Long enough (> 1024 tokens) for both providers' prompt caches.
LONG_SYSTEM = " ".join(f"Rule {i}: answer politely and precisely about topic number {i}." for i in range(200))


def direct_openai(emu: RunningEmulator) -> openai.OpenAI:
    return openai.OpenAI(base_url=emu.openai_url, api_key=EMU_KEY, max_retries=0)


def direct_anthropic(emu: RunningEmulator) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=emu.url, api_key=EMU_KEY, max_retries=0)


def openai_text(chunks: Any) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def anthropic_text(events: Any) -> str:
    return "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")


# --- OpenAI ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["policy", "passthrough"])
def test_openai_sync_create_and_stream(emu: RunningEmulator, policy: Path, mode: str) -> None:
    if mode == "policy":
        client = sdk.OpenAI(policy=policy, max_retries=0)
    else:
        client = sdk.OpenAI(base_url=emu.openai_url, api_key=EMU_KEY, max_retries=0)
    assert type(client) is openai.OpenAI
    expected = direct_openai(emu).chat.completions.create(model=GPT, messages=HELLO)

    got = client.chat.completions.create(model=GPT, messages=HELLO)
    assert got.choices[0].message.content == expected.choices[0].message.content
    assert got.usage == expected.usage

    with client.chat.completions.create(model=GPT, messages=HELLO, stream=True) as stream:
        assert openai_text(stream) == expected.choices[0].message.content
    assert emu.stats()["completed_streams"] == 1


async def test_openai_async_create_and_stream(emu: RunningEmulator, policy: Path, loop_pool: None) -> None:
    client = sdk.AsyncOpenAI(policy=policy, max_retries=0)
    assert type(client) is openai.AsyncOpenAI
    expected = direct_openai(emu).chat.completions.create(model=GPT, messages=HELLO)

    got = await client.chat.completions.create(model=GPT, messages=HELLO)
    assert got.choices[0].message.content == expected.choices[0].message.content

    stream = await client.chat.completions.create(model=GPT, messages=HELLO, stream=True, stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    assert openai_text(chunks) == expected.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == expected.usage.completion_tokens


def test_openai_tool_round_trip(emu: RunningEmulator, policy: Path) -> None:
    client = sdk.OpenAI(policy=policy, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris? Use get_weather."}]
    first = client.chat.completions.create(model=GPT, messages=messages, tools=[WEATHER_TOOL_OPENAI])
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}]
    second = client.chat.completions.create(model=GPT, messages=messages, tools=[WEATHER_TOOL_OPENAI])
    expected = direct_openai(emu).chat.completions.create(model=GPT, messages=messages, tools=[WEATHER_TOOL_OPENAI])
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == expected.choices[0].message.content


# --- Anthropic -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["policy", "passthrough"])
def test_anthropic_sync_create_stream_and_helper(emu: RunningEmulator, policy: Path, mode: str) -> None:
    if mode == "policy":
        client = sdk.Anthropic(policy=policy, max_retries=0)
    else:
        client = sdk.Anthropic(base_url=emu.url, api_key=EMU_KEY, max_retries=0)
    assert type(client) is anthropic.Anthropic
    expected = direct_anthropic(emu).messages.create(model=CLAUDE, max_tokens=256, messages=HELLO)
    text = expected.content[0].text

    got = client.messages.create(model=CLAUDE, max_tokens=256, messages=HELLO)
    assert got.content[0].text == text and got.usage == expected.usage and got.stop_reason == expected.stop_reason

    with client.messages.create(model=CLAUDE, max_tokens=256, messages=HELLO, stream=True) as stream:
        assert anthropic_text(stream) == text

    with client.messages.stream(model=CLAUDE, max_tokens=256, messages=HELLO) as helper:
        assert "".join(helper.text_stream) == text
        final = helper.get_final_message()
    assert final.content[0].text == text and final.usage.output_tokens == expected.usage.output_tokens

    assert client.messages.count_tokens(model=CLAUDE, messages=HELLO).input_tokens == (
        direct_anthropic(emu).messages.count_tokens(model=CLAUDE, messages=HELLO).input_tokens
    )


async def test_anthropic_async_create_stream_and_helper(emu: RunningEmulator, policy: Path, loop_pool: None) -> None:
    client = sdk.AsyncAnthropic(policy=policy, max_retries=0)
    assert type(client) is anthropic.AsyncAnthropic
    text = direct_anthropic(emu).messages.create(model=CLAUDE, max_tokens=256, messages=HELLO).content[0].text

    got = await client.messages.create(model=CLAUDE, max_tokens=256, messages=HELLO)
    assert got.content[0].text == text

    stream = await client.messages.create(model=CLAUDE, max_tokens=256, messages=HELLO, stream=True)
    assert anthropic_text([event async for event in stream]) == text

    async with client.messages.stream(model=CLAUDE, max_tokens=256, messages=HELLO) as helper:
        final = await helper.get_final_message()
    assert final.content[0].text == text
    assert emu.stats()["completed_streams"] == 2


def test_anthropic_tool_round_trip(emu: RunningEmulator, policy: Path) -> None:
    client = sdk.Anthropic(policy=policy, max_retries=0)
    tools = [WEATHER_TOOL_ANTHROPIC]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.messages.create(model=CLAUDE, max_tokens=256, messages=messages, tools=tools, tool_choice={"type": "any"})
    use = next(block for block in first.content if block.type == "tool_use")
    assert first.stop_reason == "tool_use" and use.name == "get_weather" and "city" in use.input
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 degrees"}]}]
    with client.messages.stream(model=CLAUDE, max_tokens=256, messages=messages, tools=tools) as helper:
        second = helper.get_final_message()
    expected = direct_anthropic(emu).messages.create(model=CLAUDE, max_tokens=256, messages=messages, tools=tools)
    assert second.stop_reason == "end_turn" and second.content[0].text == expected.content[0].text


# --- usage, headers, errors --------------------------------------------------------------------------


def test_prompt_cache_usage_carried_through(emu: RunningEmulator, policy: Path) -> None:
    """Two identical calls direct, then the same two through the SDK on a fresh emulator: same usage."""
    system = [{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}]
    long_chat = [{"role": "system", "content": LONG_SYSTEM}, *HELLO]

    def run(anth: anthropic.Anthropic, oai: openai.OpenAI) -> list[Any]:
        anth_usage = [anth.messages.create(model=CLAUDE, max_tokens=64, system=system, messages=HELLO).usage for _ in range(2)]
        oai_usage = [oai.chat.completions.create(model=GPT, messages=long_chat).usage for _ in range(2)]
        return anth_usage + oai_usage

    direct = run(direct_anthropic(emu), direct_openai(emu))
    emu.reset()
    via = run(sdk.Anthropic(policy=policy, max_retries=0), sdk.OpenAI(policy=policy, max_retries=0))
    assert via == direct
    assert via[0].cache_creation_input_tokens > 0 and via[1].cache_read_input_tokens == via[0].cache_creation_input_tokens
    assert via[3].prompt_tokens_details.cached_tokens >= 1024

    raw = sdk.Anthropic(policy=policy).messages.with_raw_response.create(model=CLAUDE, max_tokens=64, system=system, messages=HELLO)
    assert raw.headers["x-slipstream-prompt-cache"].startswith(f"read={raw.parse().usage.cache_read_input_tokens};")


def test_route_header_via_with_raw_response(policy: Path) -> None:
    raw = sdk.OpenAI(policy=policy).chat.completions.with_raw_response.create(model=GPT, messages=HELLO)
    assert raw.status_code == 200
    assert raw.headers["x-slipstream-route"] == f"gpt/{GPT}"
    assert raw.headers["x-slipstream-cache"] == "miss"
    assert float(raw.headers["x-slipstream-overhead-ms"]) >= 0
    assert raw.parse().choices[0].message.content

    raw = sdk.Anthropic(policy=policy).messages.with_raw_response.create(model=CLAUDE, max_tokens=32, messages=HELLO)
    assert raw.headers["x-slipstream-route"] == f"claude/{CLAUDE}"


def test_unknown_model_is_not_found(policy: Path) -> None:
    with pytest.raises(openai.NotFoundError, match="no route for model 'mistral-large'"):
        sdk.OpenAI(policy=policy, max_retries=0).chat.completions.create(model="mistral-large", messages=HELLO)
    with pytest.raises(anthropic.NotFoundError, match="no route for model 'mistral-large'") as info:
        sdk.Anthropic(policy=policy, max_retries=0).messages.create(model="mistral-large", max_tokens=8, messages=HELLO)
    assert info.value.body["error"]["type"] == "not_found_error"


def test_upstream_401_is_a_401_without_the_providers_body(tmp_path: Path, emu: RunningEmulator) -> None:
    """Still the provider's status and error code, but the gateway's message: the provider's body can
    echo the key (docs/security.md)."""
    bad = write_policy(tmp_path, emu, "wrong-key")
    with pytest.raises(openai.AuthenticationError) as info:
        sdk.OpenAI(policy=bad, max_retries=0).chat.completions.create(model=GPT, messages=HELLO)
    assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
    with pytest.raises(anthropic.AuthenticationError, match="refused the gateway's upstream credentials"):
        sdk.Anthropic(base_url=emu.url, api_key="wrong-key", max_retries=0).messages.create(model=CLAUDE, max_tokens=8, messages=HELLO)


def test_policy_from_environment_and_models_list(policy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLIPSTREAM_POLICY", str(policy))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    client = sdk.OpenAI()  # no api_key: the policy holds the upstream keys
    assert client.chat.completions.create(model=GPT, messages=HELLO).choices[0].message.content
    # Only glob routes: the listing is the upstream's own models that the globs match.
    listed = [model.id for model in client.models.list()]
    assert GPT in listed and all(name.startswith(("gpt-", "claude-")) for name in listed)
    assert client.models.retrieve(GPT).id == GPT
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("text-davinci-001")


# --- cancellation --------------------------------------------------------------------------------------


def test_sync_break_cancels_upstream(emu: RunningEmulator, policy: Path) -> None:
    client = sdk.OpenAI(policy=policy, max_retries=0)
    with slow_stream(emu):
        with client.chat.completions.create(model=GPT, messages=HELLO, stream=True) as stream:
            for _ in stream:
                break
        # Closing did not read the rest (a 10 s stream): it had not finished upstream when close returned.
        assert emu.stats()["completed_streams"] == 0
        stats = emu.wait_for(lambda s: s["cancelled_streams"] == 1, timeout=PATIENCE_S)
    assert stats["open_streams"] == 0 and stats["completed_streams"] == 0

    anth = sdk.Anthropic(policy=policy, max_retries=0)
    with slow_stream(emu):
        with anth.messages.stream(model=CLAUDE, max_tokens=4000, messages=HELLO) as helper:
            next(iter(helper.text_stream))
        emu.wait_for(lambda s: s["cancelled_streams"] == 2, timeout=PATIENCE_S)


async def test_async_break_cancels_upstream(emu: RunningEmulator, policy: Path, loop_pool: None) -> None:
    client = sdk.AsyncOpenAI(policy=policy, max_retries=0)
    with slow_stream(emu):
        stream = await client.chat.completions.create(model=GPT, messages=HELLO, stream=True)
        async for _ in stream:
            break
        await stream.close()
        await asyncio.to_thread(emu.wait_for, lambda s: s["cancelled_streams"] == 1, PATIENCE_S)

        anth = sdk.AsyncAnthropic(policy=policy, max_retries=0)
        async with anth.messages.stream(model=CLAUDE, max_tokens=4000, messages=HELLO) as helper:
            async for _ in helper.text_stream:
                break
        stats = await asyncio.to_thread(emu.wait_for, lambda s: s["cancelled_streams"] == 2, PATIENCE_S)
    assert stats["open_streams"] == 0


async def test_sync_client_inside_running_loop(emu: RunningEmulator, policy: Path) -> None:
    """A sync client called from a coroutine blocks that loop, but never deadlocks: the pipeline has its own."""
    client = sdk.Anthropic(policy=policy, max_retries=0)
    with client.messages.stream(model=CLAUDE, max_tokens=64, messages=HELLO) as helper:
        assert helper.get_final_message().content[0].text


def test_sync_stream_buffer_is_bounded(emu: RunningEmulator, policy: Path) -> None:
    """A consumer that stops reading stops the pump: at most a bounded buffer is read ahead."""
    from sdk.dropin import _BUFFER_EVENTS

    client = sdk.OpenAI(policy=policy, max_retries=0)
    with slow_stream(emu, per_token_ms=0.0, tokens=4000):  # ~1000 events, sent as fast as possible
        with client.chat.completions.with_streaming_response.create(model=GPT, messages=HELLO, stream=True) as response:
            next(response.iter_bytes())
            time.sleep(0.2)  # the upstream has long finished sending by now
            buffered = response.http_response.stream._stream._queue.qsize()  # httpx2 wraps our byte stream
            # Events take a credit each; the end marker or an error is queued without one.
            assert 0 < buffered <= _BUFFER_EVENTS + 1
        emu.wait_for(lambda s: s["open_streams"] == 0, timeout=PATIENCE_S)


# --- failures mid-stream ---------------------------------------------------------------------------------


def test_sync_midstream_drop_ends_with_error_event(emu: RunningEmulator, policy: Path) -> None:
    emu.inject_fault("disconnect_after:events=3")
    client = sdk.Anthropic(policy=policy, max_retries=0)
    with pytest.raises(anthropic.APIStatusError, match=r"mid-stream|before it finished"), \
            client.messages.stream(model=CLAUDE, max_tokens=256, messages=HELLO) as helper:
        helper.get_final_message()


async def test_async_midstream_error_event_reaches_client(emu: RunningEmulator, policy: Path, loop_pool: None) -> None:
    emu.inject_fault("midstream_error:events=2")
    client = sdk.AsyncOpenAI(policy=policy, max_retries=0)
    stream = await client.chat.completions.create(model=GPT, messages=HELLO, stream=True)
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_client_timeout_bounds_the_wait(emu: RunningEmulator, policy: Path, loop_pool: None, kind: str) -> None:
    # The stall outlasts the test: only the client's timeout can end the call. The timeout leaves a
    # loaded machine ample time to reach the emulator first, so the upstream call exists to be dropped.
    emu.inject_fault(f"stall:ms={STALL_MS}")
    with pytest.raises(openai.APITimeoutError):
        if kind == "sync":
            sdk.OpenAI(policy=policy, max_retries=0, timeout=2).chat.completions.create(model=GPT, messages=HELLO)
        else:
            await sdk.AsyncOpenAI(policy=policy, max_retries=0, timeout=2).chat.completions.create(model=GPT, messages=HELLO)
    await asyncio.to_thread(emu.wait_for, lambda s: s["cancelled_requests"] == 1, PATIENCE_S)  # the upstream call was dropped


def test_sync_clients_share_one_loop_thread_across_threads(emu: RunningEmulator, policy: Path) -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    client = sdk.Anthropic(policy=policy, max_retries=0)
    prompts = [[{"role": "user", "content": f"Question number {i}"}] for i in range(8)]
    expected = [direct_anthropic(emu).messages.create(model=CLAUDE, max_tokens=64, messages=p).content[0].text for p in prompts]

    def ask(messages: list[dict[str, str]]) -> str:
        with client.messages.stream(model=CLAUDE, max_tokens=64, messages=messages) as helper:
            return "".join(helper.text_stream)

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(ask, prompts)) == expected
    assert sum(t.name == "slipstream-sdk-loop" for t in threading.enumerate()) == 1
