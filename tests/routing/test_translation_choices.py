"""Chat Completions `n` > 1 on a Claude target (sdk/routing/translation/choices.py): n Messages
requests merged into one answer, through both doors (the proxy with the official `openai` client on
loopback, the drop-in SDK in process), the emulator as Claude.

Each test was a 400 before (`'n' cannot be translated`). What is checked is what the emulator counted
and what the answer says, never how long anything took.
"""

from __future__ import annotations

import contextlib
import uuid
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import sdk
from emulator.app import EmulatorConfig
from emulator.testing import RunningEmulator, running_emulator
from gateway.testing import running_proxy
from tests.helpers import STALL_MS
from tests.routing.conftest import policy_text

ROUTES = """  - match: {model: "gpt-*"}
    targets: [{provider: claude, model: claude-sonnet-4-5}]"""
ONCE = "retry: {max_attempts: 1}"
ASK = [{"role": "user", "content": "Tell me about fjords."}]
RULES = "\n".join(f"Rule {i}: answer in one short sentence." for i in range(300))
LONG_ASK = [{"role": "system", "content": RULES}, *ASK]  # cacheable (over 1,024 tokens): the choices are staggered


@contextlib.contextmanager
def _client(door: str, directory: Path, upstream: RunningEmulator, extra: str = ONCE) -> Iterator[openai.OpenAI]:
    """The official client at a proxy on loopback, or the drop-in SDK's, for policy_text's team."""
    path = directory / "routing.yaml"
    path.write_text(policy_text(upstream.url, ROUTES, extra))
    if door == "proxy":
        with running_proxy([directory], watch_interval_s=None) as proxy:
            yield openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-routing", max_retries=0)
    else:
        yield sdk.OpenAI(policy=path, max_retries=0)


@pytest.fixture(scope="module")
def slow() -> Iterator[RunningEmulator]:
    """Paced streams (400 tokens at 20 ms): the legs are still running when the client or a leg stops."""
    with running_emulator(EmulatorConfig(per_output_token_ms=20.0, default_output_tokens=400)) as running:
        yield running


def _merged(chunks: list[Any]) -> tuple[dict[int, str], dict[int, list[str]]]:
    """Each choice's text and its finish reasons, from a stream's chunks."""
    texts: dict[int, str] = defaultdict(str)
    finishes: dict[int, list[str]] = defaultdict(list)
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index].append(choice.finish_reason)
    return texts, finishes


@pytest.mark.parametrize("door", ["proxy", "dropin"])
def test_n_choices_come_back_as_one_completion_billed_as_n_answers(door: str, tmp_path: Path, fresh_emulator) -> None:
    with _client(door, tmp_path, fresh_emulator) as client:
        one = client.chat.completions.create(model="gpt-x", messages=ASK, max_completion_tokens=30)
        three = client.chat.completions.create(model="gpt-x", messages=ASK, max_completion_tokens=30, n=3)
    assert fresh_emulator.stats()["endpoints"]["POST /v1/messages"] == 1 + 3  # one Messages request per choice
    assert [c.index for c in three.choices] == [0, 1, 2]
    for choice in three.choices:
        assert choice.message.content == one.choices[0].message.content  # the emulator answers a prompt alike
        assert choice.finish_reason == one.choices[0].finish_reason and choice.logprobs is None
    assert three.usage is not None and one.usage is not None
    assert three.usage.prompt_tokens == 3 * one.usage.prompt_tokens  # what Claude bills: the prompt per request
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens
    assert three.usage.total_tokens == three.usage.prompt_tokens + three.usage.completion_tokens


@pytest.mark.parametrize("door", ["proxy", "dropin"])
def test_n_choices_stream_as_one_stream_with_their_indexes_and_one_usage_chunk(door: str, tmp_path: Path, fresh_emulator) -> None:
    with _client(door, tmp_path, fresh_emulator) as client:
        one = list(client.chat.completions.create(model="gpt-x", messages=ASK, max_completion_tokens=30, stream=True,
                                                  stream_options={"include_usage": True}))
        three = list(client.chat.completions.create(model="gpt-x", messages=ASK, max_completion_tokens=30, n=3, stream=True,
                                                    stream_options={"include_usage": True}))
    texts, finishes = _merged(three)
    single = _merged(one)[0][0]
    assert sorted(texts) == [0, 1, 2] and all(text == single for text in texts.values())
    assert all(len(finishes[index]) == 1 for index in range(3))  # each choice ends once
    assert len({chunk.id for chunk in three}) == 1  # one completion
    usage_chunks = [chunk for chunk in three if chunk.usage is not None]
    assert usage_chunks == [three[-1]] and not three[-1].choices  # one usage chunk, last
    assert one[-1].usage is not None and three[-1].usage is not None
    assert three[-1].usage.prompt_tokens == 3 * one[-1].usage.prompt_tokens
    assert three[-1].usage.completion_tokens == 3 * one[-1].usage.completion_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_the_later_choices_read_the_prompt_the_first_one_cached(stream: bool, tmp_path: Path, fresh_emulator) -> None:
    """The first request writes the cache; the others start once it has begun answering, when the
    emulator (as Anthropic) makes its entries readable, and read them instead of writing them again."""
    messages = LONG_ASK
    with _client("proxy", tmp_path, fresh_emulator) as client:
        if stream:
            chunks = list(client.chat.completions.create(model="gpt-x", messages=messages, max_completion_tokens=20, n=3,
                                                         stream=True, stream_options={"include_usage": True}))
            usage = chunks[-1].usage
        else:
            usage = client.chat.completions.create(model="gpt-x", messages=messages, max_completion_tokens=20, n=3).usage
    assert usage is not None and usage.prompt_tokens_details is not None
    written = usage.prompt_tokens_details.cache_write_tokens or 0
    assert written > 1000  # the first request wrote the long prefix once
    assert usage.prompt_tokens_details.cached_tokens == 2 * written  # and the two others read it


def test_choices_of_a_prompt_too_short_to_cache_start_together(tmp_path: Path, slow: RunningEmulator) -> None:
    """Nothing below the model's least cacheable prefix is cached, so a later choice has nothing to
    wait for: the n requests are in flight at once. Staggered, the later ones waited for the first
    whole answer (a body: nothing of it is seen before), and at most n - 1 were in flight."""
    httpx.post(f"{slow.url}/_emulator/reset").raise_for_status()
    with _client("proxy", tmp_path, slow) as client, ThreadPoolExecutor(1) as pool:
        asked = pool.submit(client.chat.completions.create, model="gpt-x", messages=ASK, max_completion_tokens=40, n=3)
        in_flight: list[int] = []
        slow.wait_for(lambda s: in_flight.append(s["open_requests"]) or s["open_requests"] == 3 or asked.done())
        assert len(asked.result().choices) == 3
    assert max(in_flight) == 3


def test_a_failed_choice_fails_the_request_and_cancels_the_others(tmp_path: Path, slow: RunningEmulator) -> None:
    httpx.post(f"{slow.url}/_emulator/reset").raise_for_status()
    slow.inject_fault("stall:ms=1")  # the first request: answered
    slow.inject_fault("500")  # the second and third start together: one fails,
    slow.inject_fault(f"stall:ms={STALL_MS}")  # the other is held until the gateway drops it
    with _client("proxy", tmp_path, slow) as client, pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(model="gpt-x", messages=LONG_ASK, max_completion_tokens=5, n=3)
    assert failed.value.status_code == 500 and failed.value.body["type"] == "server_error"  # type: ignore[index]
    stats = slow.wait_for(lambda s: s["cancelled_requests"] == 1)
    assert stats["endpoints"]["POST /v1/messages"] == 3  # no retry, no fourth request


def test_a_choice_failing_mid_stream_ends_the_stream_and_cancels_the_others(tmp_path: Path, slow: RunningEmulator) -> None:
    httpx.post(f"{slow.url}/_emulator/reset").raise_for_status()
    slow.inject_fault("midstream_error:events=4")  # the first request fails after a few events
    with _client("proxy", tmp_path, slow) as client, pytest.raises(openai.APIError, match="Overloaded"):
        for _ in client.chat.completions.create(model="gpt-x", messages=ASK, n=3, stream=True):
            pass
    stats = slow.wait_for(lambda s: s["errored_streams"] + s["cancelled_streams"] + s["completed_streams"] == 3)
    assert stats["errored_streams"] == 1 and stats["cancelled_streams"] == 2 and stats["completed_streams"] == 0


@pytest.mark.parametrize("door", ["proxy", "dropin"])
def test_a_client_that_leaves_cancels_every_choice(door: str, tmp_path: Path, slow: RunningEmulator) -> None:
    httpx.post(f"{slow.url}/_emulator/reset").raise_for_status()
    with _client(door, tmp_path, slow) as client:
        stream = client.chat.completions.create(model="gpt-x", messages=ASK, n=3, stream=True)
        seen = set()
        for chunk in stream:
            seen.update(choice.index for choice in chunk.choices if choice.delta.content)
            if len(seen) == 3:
                break
        stream.close()
        stats = slow.wait_for(lambda s: s["cancelled_streams"] + s["completed_streams"] == 3)
    assert stats["cancelled_streams"] == 3 and stats["completed_streams"] == 0


@pytest.mark.parametrize("door", ["proxy", "dropin"])
@pytest.mark.parametrize("n", [0, 129, 2.5])
def test_n_outside_openais_range_is_a_400_in_openais_shape(door: str, n: Any, tmp_path: Path, fresh_emulator) -> None:
    with _client(door, tmp_path, fresh_emulator) as client, pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="gpt-x", messages=ASK, n=n)
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == "n" and error["type"] == "invalid_request_error"
    assert error["code"] in ("integer_below_min_value", "integer_above_max_value", "invalid_type")
    assert fresh_emulator.stats()["requests_total"] == 0


def test_the_response_cache_neither_serves_nor_stores_several_choices(tmp_path: Path, fresh_emulator) -> None:
    cache = f"{ONCE}\nsemantic_cache: {{enabled: true, semantic: false, cache_sampled: true}}"
    with _client("proxy", tmp_path, fresh_emulator, cache) as client:
        ask = {"model": "gpt-x", "messages": [{"role": "user", "content": f"Fjords? {uuid.uuid4()}"}]}
        assert client.chat.completions.with_raw_response.create(**ask).headers["x-slipstream-cache"] == "miss"
        assert client.chat.completions.with_raw_response.create(**ask).headers["x-slipstream-cache"] == "exact-hit"
        for _ in range(2):  # a stored single answer is not served as three, and three are not stored
            raw = client.chat.completions.with_raw_response.create(**ask, n=3)
            assert raw.headers["x-slipstream-cache"] == "miss" and len(raw.parse().choices) == 3
    assert fresh_emulator.stats()["endpoints"]["POST /v1/messages"] == 1 + 3 + 3


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_usage_carries_their_reasoning_tokens_summed(stream: bool, tmp_path: Path, fresh_emulator) -> None:
    """Each choice is a Claude answer whose thinking Claude reports within its output tokens (Chat's
    completion_tokens_details.reasoning_tokens). The merged usage summed the counts but left the reasoning out:
    a client of n choices saw no reasoning tokens at all, of one choice the right count."""
    asked: dict[str, Any] = {"model": "gpt-x", "messages": ASK, "max_completion_tokens": 3000, "reasoning_effort": "low"}
    if stream:
        asked |= {"stream": True, "stream_options": {"include_usage": True}}
    with _client("proxy", tmp_path, fresh_emulator) as client:
        answers = [client.chat.completions.create(**asked, n=n) for n in (1, 3)]
    one, three = (list(answer)[-1].usage if stream else answer.usage for answer in answers)
    assert one is not None and one.completion_tokens_details is not None
    thought = one.completion_tokens_details.reasoning_tokens or 0
    assert thought > 0
    assert three is not None and three.completion_tokens_details is not None  # before: None
    assert three.completion_tokens_details.reasoning_tokens == 3 * thought
    assert three.completion_tokens == 3 * one.completion_tokens
