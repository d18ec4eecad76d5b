"""Prompt caching across protocols to the local engine: each door (Chat Completions, Messages,
Responses) reaching a `kind: local` target reads the engine's prefix cache like the native Chat
request does, and the client sees the read in its own usage shape and in `x-slipstream-prompt-cache`.

The engine caches by exact token prefix (paged blocks), so the same conversation through any door
must render to the same prompt: after the native request has run, each door's turns read at least
as many cached tokens as the native turns did.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from gateway.testing import running_proxy
from tests.helpers import requires_extra

pytestmark = [pytest.mark.slow, requires_extra("engine")]  # the demo model is loaded by the proxy

SYSTEM = "You are the field-service assistant of ACME. Answer from the service manual. " * 6
QUESTIONS = ["How do I reset the pump controller?", "And how do I bleed the hydraulic line afterwards?"]
ANSWER = "Hold the reset key for five seconds."
DOORS = ("chat", "messages", "responses")


@pytest.fixture(scope="module")
def proxy(tmp_path_factory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("local-matrix")
    for door in DOORS:
        (directory / f"local-{door}.yaml").write_text(f"""team: local-{door}
api_keys: [{{value: "key-local-{door}"}}]
providers:
  local: {{kind: local, model: demo}}
routes:
  - match: {{model: "*"}}
    targets: [{{provider: local}}]
""")
    with running_proxy([directory], watch_interval_s=None) as running:
        yield running.url


def _turns(turn: int) -> list[dict[str, str]]:
    out = [{"role": "user", "content": QUESTIONS[0]}]
    if turn:
        out += [{"role": "assistant", "content": ANSWER}, {"role": "user", "content": QUESTIONS[1]}]
    return out


def _send(proxy: str, door: str, key: str, turn: int) -> tuple[int, int]:
    """One turn through `door`: (cached tokens in the client's own usage shape, the header's read)."""
    if door == "messages":
        client = anthropic.Anthropic(base_url=proxy, api_key=key, max_retries=0)
        raw = client.messages.with_raw_response.create(model="any", max_tokens=4, system=SYSTEM, messages=_turns(turn))  # type: ignore[arg-type]
        cached, headers = raw.parse().usage.cache_read_input_tokens or 0, raw.headers
    else:
        oa = openai.OpenAI(base_url=f"{proxy}/v1", api_key=key, max_retries=0)
        if door == "chat":
            raw_chat = oa.chat.completions.with_raw_response.create(
                model="any", max_tokens=4, messages=[{"role": "system", "content": SYSTEM}, *_turns(turn)])  # type: ignore[list-item]
            usage = raw_chat.parse().usage
            assert usage is not None and usage.prompt_tokens_details is not None
            cached, headers = usage.prompt_tokens_details.cached_tokens or 0, raw_chat.headers
        else:
            raw_responses = oa.responses.with_raw_response.create(model="any", max_output_tokens=4, instructions=SYSTEM,
                                                                  input=_turns(turn))  # type: ignore[arg-type]
            responses_usage = raw_responses.parse().usage
            assert responses_usage is not None
            cached, headers = responses_usage.input_tokens_details.cached_tokens, raw_responses.headers
    report = dict(part.split("=", 1) for part in headers["x-slipstream-prompt-cache"].split(";"))
    return cached, int(report["read"])


@pytest.mark.parametrize("door", DOORS)
def test_every_door_reads_the_engines_prefix_cache_like_the_native_request(proxy, door):
    key = f"key-local-{door}"  # each door its own team: its own cache_salt, so nothing is read across cells
    native = [_send(proxy, "chat", key, turn) for turn in range(2)]
    assert native[0][0] == 0 and native[1][0] > 0  # the second turn reads the first turn's prefix
    through_door = [_send(proxy, door, key, turn) for turn in range(2)]
    for (cached, read), (native_cached, _) in zip(through_door, native, strict=True):
        assert read == cached  # the header and the client's usage agree
        assert cached >= native_cached and cached > 0  # the same prompt: what the native turns cached is read
    # The native second turn read only the first turn's prefix; the door's second turn reads the whole
    # second-turn prompt the native one cached, so the two renderings agree past the first turn too.
    assert through_door[1][0] > native[1][0]


def test_a_stop_sequence_that_ends_the_local_models_answer_reaches_an_anthropic_client(proxy):
    """Messages to the local engine with `stop_sequences`: the answer that a sequence cut short ends
    with stop_reason `stop_sequence` and names it (it was `end_turn`, stop_sequence null), streamed too."""
    client = anthropic.Anthropic(base_url=proxy, api_key="key-local-messages", max_retries=0)
    ask = {"model": "any", "max_tokens": 12, "messages": _turns(0), "extra_body": {"temperature": 0}}
    free = "".join(b.text for b in client.messages.create(**ask).content if b.type == "text")  # type: ignore[arg-type]
    words = free.split()
    assert words, free
    stop = words[len(words) // 2]  # the engine stops at its first occurrence, wherever that is
    cut = client.messages.create(**ask, stop_sequences=[stop])  # type: ignore[arg-type]
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    with client.messages.stream(**ask, stop_sequences=[stop]) as stream:  # type: ignore[arg-type]
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)


def test_token_counts_for_the_local_engine_are_its_own_prompt_tokens(proxy):
    """`messages.count_tokens` and `responses.input_tokens.count` routed to the local engine were a
    400; they count with the engine's own tokenizer and chat template, so they equal the
    `prompt_tokens` its answer reports, and a translated stream's message_start carries that count."""
    oa = openai.OpenAI(base_url=f"{proxy}/v1", api_key="key-local-chat", max_retries=0)
    answer = oa.chat.completions.create(model="any", max_tokens=1, messages=[{"role": "system", "content": SYSTEM}, *_turns(1)])  # type: ignore[list-item]
    assert answer.usage is not None
    exact = answer.usage.prompt_tokens
    an = anthropic.Anthropic(base_url=proxy, api_key="key-local-messages", max_retries=0)
    assert an.messages.count_tokens(model="any", system=SYSTEM, messages=_turns(1)).input_tokens == exact  # type: ignore[arg-type]
    counted = openai.OpenAI(base_url=f"{proxy}/v1", api_key="key-local-responses", max_retries=0).responses.input_tokens.count(
        model="any", instructions=SYSTEM, input=_turns(1))  # type: ignore[arg-type]
    assert counted.input_tokens == exact
    with an.messages.stream(model="any", max_tokens=2, system=SYSTEM, messages=_turns(1)) as stream:  # type: ignore[arg-type]
        starts = [event.message.usage.input_tokens for event in stream if event.type == "message_start"]
        usage = stream.get_final_message().usage
    assert starts == [exact] == [usage.input_tokens + (usage.cache_read_input_tokens or 0)]
