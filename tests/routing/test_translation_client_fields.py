"""Fields real clients send that a translated route refused or lost (a fifth audit of the translation).

The official clients through the proxy (team key "sk-routing"), the emulator as the upstream of the other protocol;
each test failed on the code before its fix.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from gateway.testing import running_proxy
from tests.routing.conftest import policy_text, routed_proxy, sent

ROUTES = """  - match: {model: "claude-o3-*"}
    targets: [{provider: gpt, model: o3}]
  - match: {model: "claude-*"}
    targets: [{provider: gpt, model: gpt-4o}]
  - match: {model: "gpt-*"}
    targets: [{provider: claude, model: claude-sonnet-4-5}]"""
ASK: Any = [{"role": "user", "content": "Which city is the capital of France?"}]
CITY: Any = {"type": "object", "properties": {"name": {"type": "string"}, "country": {"type": "string"}},
             "required": ["name", "country"], "additionalProperties": False}
# What clients written for the structured-outputs beta send (the anthropic SDK before it merged the parameter into
# output_config, LangChain's and other frameworks' Claude clients): a top-level `output_format` and the beta header.
BETA_FORMAT: Any = {"output_format": {"type": "json_schema", "schema": CITY}}
BETA_HEADER = {"anthropic-beta": "structured-outputs-2025-11-13"}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    yield from routed_proxy(tmp_path_factory.mktemp("client_fields"), emulator.url, ROUTES)


def test_the_structured_outputs_betas_output_format_reaches_an_openai_model_as_its_json_schema(an, fresh_emulator):
    """`output_format`, the structured-outputs beta's name of `output_config.format` (the anthropic SDK calls it
    deprecated and sends it as output_config.format; clients written for the beta still send it), was refused for an
    OpenAI target as a field the gateway does not know. It is the same request as output_config.format: a strict
    json_schema response_format, the answer Claude's JSON text, in a body and a stream."""
    answer = an.messages.create(model="claude-x", max_tokens=200, messages=ASK, extra_body=BETA_FORMAT, extra_headers=BETA_HEADER)
    body = sent(fresh_emulator)
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "response", "schema": CITY, "strict": True}}
    assert "output_format" not in body
    assert set(json.loads(answer.content[0].text)) == {"name", "country"}
    with an.messages.stream(model="claude-x", max_tokens=200, messages=ASK, extra_body=BETA_FORMAT, extra_headers=BETA_HEADER) as stream:
        text = stream.get_final_message().content[0]
    assert sent(fresh_emulator)["response_format"]["json_schema"]["schema"] == CITY
    assert text.type == "text" and set(json.loads(text.text)) == {"name", "country"}


def test_output_format_beside_output_config_format_is_the_clients_400(an, fresh_emulator):
    """Both names of the format at once is the client's error, as the anthropic SDK says before sending ("Both
    output_format and output_config.format were provided"); a cache warming with one is Anthropic's 400, as with
    output_config.format."""
    both = {**BETA_FORMAT, "output_config": {"format": {"type": "json_schema", "schema": CITY}}}
    with pytest.raises(anthropic.BadRequestError, match=r"output_format and output_config\.format"):
        an.messages.create(model="claude-x", max_tokens=200, messages=ASK, extra_body=both)
    with pytest.raises(anthropic.BadRequestError, match=r"max_tokens: 0 is not supported with output_config\.format"):
        an.messages.create(model="claude-x", max_tokens=0, messages=ASK, extra_body=BETA_FORMAT)
    assert not fresh_emulator.state.recent


def test_prompt_cache_diagnostics_a_responses_client_asks_a_claude_model_for_are_unavailable(oa, fresh_emulator):
    """`prompt_cache_options.comparison_response_id` asks OpenAI why the cache was or was not reused against an earlier
    response (openai 3.x, gpt-5.6: the response's `prompt_cache_diagnostics`, whose `unavailable` says "no diagnosis").
    A Claude model answered with no diagnostics at all, as if none had been asked for; now `unavailable`, as a
    Messages client's `diagnostics` answered by an OpenAI model is. Not asked, none is given."""
    first = oa.responses.create(model="gpt-x", input="Hi")
    assert first.prompt_cache_diagnostics is None
    asked = {"comparison_response_id": first.id}
    answer = oa.responses.create(model="gpt-x", input="Hi again", prompt_cache_options=asked)
    assert answer.prompt_cache_diagnostics is not None and answer.prompt_cache_diagnostics.type == "unavailable"
    assert "prompt_cache_options" not in sent(fresh_emulator)
    with oa.responses.stream(model="gpt-x", input="Hi again", prompt_cache_options=asked) as stream:
        final = stream.get_final_response()
    assert final.prompt_cache_diagnostics is not None and final.prompt_cache_diagnostics.type == "unavailable"
    assert oa.responses.retrieve(answer.id).prompt_cache_diagnostics.type == "unavailable"  # type: ignore[union-attr]


def test_a_chat_model_behind_a_chat_only_upstream_is_sent_the_cache_options_chat_takes(tmp_path, fresh_emulator):
    """For gpt-5.6 behind a Chat-only upstream (`responses: chat`) the options go on as Chat's, which has no
    comparison_response_id (Chat's prompt_cache_options: mode and ttl): it is not sent, and the diagnostics are
    `unavailable`, as for Claude."""
    policy = policy_text(fresh_emulator.url, """  - match: {model: "*"}
    targets: [{provider: chat, model: gpt-5.6}]""").replace(
        "routes:", f'  chat: {{kind: openai, base_url: "{fresh_emulator.url}/v1", api_key: "up-openai", responses: chat}}\nroutes:')
    (tmp_path / "routing.yaml").write_text(policy)
    with running_proxy([tmp_path], watch_interval_s=None) as running:
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="sk-routing", max_retries=0)
        answer = client.responses.create(model="gpt-5.6", input="Hi", max_output_tokens=16,
                                         prompt_cache_options={"mode": "explicit", "comparison_response_id": "resp_1"})
    assert fresh_emulator.state.recent[-1]["path"].endswith("/chat/completions")
    assert sent(fresh_emulator)["prompt_cache_options"] == {"mode": "explicit"}
    assert answer.prompt_cache_diagnostics is not None and answer.prompt_cache_diagnostics.type == "unavailable"


LONG = " ".join(f"Rule {i}: answer about item {i} precisely." for i in range(600))  # over Claude's least cacheable prefix


def test_a_json_mode_conversation_on_claude_reads_its_earlier_turns_from_the_cache(oa, fresh_emulator):
    """A Chat JSON-mode request (json_object; json_schema to a model without structured outputs) reaches a Claude model
    that takes a prefill as an instruction and an assistant turn opening the object, `{`. The conversation's rolling
    breakpoint went on that prefill, a prefix the next turn never has (it holds the whole answer there): each turn
    wrote the whole conversation again and read only the system prompt. It goes on the turn before it now, so each
    turn reads the one before, as a conversation without JSON mode does."""
    messages: list[Any] = [{"role": "system", "content": LONG}]
    read = []
    for turn in range(3):
        messages.append({"role": "user", "content": f"Turn {turn}: describe item {turn} as JSON. " + "More detail. " * 200})
        answer = oa.chat.completions.create(model="gpt-x", messages=messages, response_format={"type": "json_object"})
        body = sent(fresh_emulator)
        assert body["messages"][-1] == {"role": "assistant", "content": [{"type": "text", "text": "{"}]}  # the prefill
        assert "cache_control" in body["messages"][-2]["content"][-1]  # the user's turn ends the prefix cached
        assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
        read.append(answer.usage.prompt_tokens_details.cached_tokens or 0)
        messages.append({"role": "assistant", "content": answer.choices[0].message.content})
    assert read[2] > read[1] > read[0] + 1000  # each turn reads the one before (the old code: the system prompt only)


@pytest.mark.parametrize(("model", "stops"), [("claude-o3-x", 1), ("claude-x", 5)])
def test_stop_sequences_an_openai_model_would_refuse_are_applied_by_the_gateway(an, fresh_emulator, model, stops):
    """A Messages request's stop sequences to an OpenAI reasoning model (o3, gpt-5: "Unsupported parameter: 'stop'"),
    or more than OpenAI's 4 to any model, were a 400 before sending. They are the gateway's now, all of them (OpenAI
    would not say which of its own ended the answer): none is sent, and the answer is cut where one first appears,
    ending stop_sequence and naming it, as Claude's, in a body and a stream."""
    whole = an.messages.create(model=model, max_tokens=64, messages=ASK).content[0]
    assert whole.type == "text"
    words = whole.text.split(" ")
    stop = " " + words[len(words) // 2]  # a word the answer holds, the same answer each time
    expected = whole.text[:whole.text.index(stop)]
    listed = [stop, *(f"<never {i}>" for i in range(stops - 1))]
    answer = an.messages.create(model=model, max_tokens=64, messages=ASK, stop_sequences=listed)
    assert "stop" not in sent(fresh_emulator)
    assert answer.stop_reason == "stop_sequence" and answer.stop_sequence == stop
    assert answer.content[0].type == "text" and answer.content[0].text == expected
    with an.messages.stream(model=model, max_tokens=64, messages=ASK, stop_sequences=listed) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(texts) == expected and final.stop_reason == "stop_sequence" and final.stop_sequence == stop
    unmatched = an.messages.create(model=model, max_tokens=64, messages=ASK, stop_sequences=["<never>"] * stops)
    assert unmatched.stop_reason == "end_turn" and unmatched.content[0].type == "text" and unmatched.content[0].text == whole.text
