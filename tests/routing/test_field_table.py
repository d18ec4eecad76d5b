"""Fields by meaning (sdk/routing/translation/fields.py) and JSON output modes across protocols.

The table is walked field by field (and compared with its copy in docs/api.md); then, through the
proxy with the official clients, dropped fields are named in `x-slipstream-dropped-fields` and never
reach the provider, refused ones are a 400 naming the field and the target protocol, and JSON mode
(`response_format`, Responses `text.format`) reaches Claude as structured outputs or as an
instruction with a prefill, and comes back as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import orjson
import pytest

from gateway.testing import running_proxy
from sdk.errors import SlipstreamError
from sdk.promptcache.keys import team_user
from sdk.routing.backoff import TranslationRefused
from sdk.routing.translation.bodies import message_a2o
from sdk.routing.translation.fields import DROPPED_HEADER, FIELDS, Fate, Shape, check, table_markdown
from sdk.routing.translation.requests import openai_to_anthropic
from tests.routing.conftest import sent as _sent

KEY = "sk-fields"
TARGET = {Shape.CHAT: "Anthropic", Shape.MESSAGES: "OpenAI", Shape.RESPONSES: "Anthropic Messages"}
SAMPLE = object()  # a value that is no field's neutral one
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
          "required": ["city", "days"], "additionalProperties": False}


@pytest.mark.parametrize("shape", list(Shape))
def test_every_field_of_every_shape_has_its_fate(shape):
    for key, field in FIELDS[shape].items():
        if field.fate is Fate.REFUSED:
            with pytest.raises(TranslationRefused) as refused:
                check(shape, {key: SAMPLE}, TARGET[shape])
            assert repr(key) in str(refused.value) and TARGET[shape] in str(refused.value)
        elif key not in ("include", "prompt_cache_retention", "prompt_cache_options", "max_tool_calls"):  # a list; by target, tools: below
            assert check(shape, {key: SAMPLE}, TARGET[shape]) == ([key] if field.fate is Fate.DROPPED else [])
        for neutral in field.neutral:  # a default value changes nothing: dropped whatever the fate
            assert check(shape, {key: neutral}, TARGET[shape]) == [key]
        assert check(shape, {key: None}, TARGET[shape]) == []  # null is absent: nothing to refuse or name
    with pytest.raises(TranslationRefused, match=r"'no_such_field'.*not a field this gateway knows"):
        check(shape, {"no_such_field": 1}, TARGET[shape])


def test_include_entries_and_a_reasoning_summary_that_ask_for_nothing_a_translated_answer_has_are_dropped_and_named():
    assert check(Shape.RESPONSES, {"include": ["reasoning.encrypted_content"]}, "Anthropic Messages") == ["include.reasoning.encrypted_content"]
    assert check(Shape.RESPONSES, {"model": "claude-opus-4-6", "reasoning": {"effort": "low", "summary": "auto"}},
                 "Anthropic Messages") == ["reasoning.summary"]
    assert check(Shape.CHAT, {"verbosity": "medium"}, "Anthropic") == ["verbosity"]  # the default: changes nothing
    assert check(Shape.RESPONSES, {"prompt_cache_retention": "24h"}, "Anthropic Messages") == ["prompt_cache_retention"]
    assert check(Shape.RESPONSES, {"model": "gpt-5.1", "prompt_cache_retention": "24h"}, "Chat Completions") == []
    assert check(Shape.RESPONSES, {"model": "gpt-5.6", "prompt_cache_options": {"mode": "explicit"}}, "Anthropic Messages") == ["prompt_cache_options"]
    assert check(Shape.RESPONSES, {"model": "gpt-5.6", "prompt_cache_options": {"mode": "explicit"}}, "Chat Completions") == []
    assert check(Shape.RESPONSES, {"max_tool_calls": 2, "tools": [{"type": "function", "name": "f"}]}, "Anthropic Messages") == ["max_tool_calls"]
    # beside web search to Claude, its tool's max_uses (web_search.py); beside another built-in tool, refused
    assert check(Shape.RESPONSES, {"max_tool_calls": 2, "tools": [{"type": "web_search"}]}, "Anthropic Messages") == []
    with pytest.raises(TranslationRefused, match=r"'max_tool_calls' beside the built-in tool 'web_search'"):
        check(Shape.RESPONSES, {"max_tool_calls": 2, "tools": [{"type": "web_search"}]}, "Chat Completions")
    with pytest.raises(TranslationRefused, match=r"include 'file_search_call.results' cannot be translated for an Anthropic"):
        check(Shape.RESPONSES, {"include": ["file_search_call.results"]}, "Anthropic Messages")


def test_the_table_in_the_docs_is_the_table_in_the_code():
    docs = (Path(__file__).parents[2] / "docs" / "api.md").read_text()
    assert table_markdown() in docs


def test_a_json_mode_answer_from_a_prefilled_claude_gets_its_prefill_back_and_is_validated():
    body = openai_to_anthropic({"model": "claude-3-5-haiku", "response_format": {"type": "json_object"},
                                "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]})
    assert body["messages"][-1] == {"role": "assistant", "content": [{"type": "text", "text": "{"}]}
    assert body["system"].startswith("Be brief.\n\nAnswer with one JSON object") and "output_config" not in body
    answer = {"id": "m", "model": "claude-3-5-haiku", "content": [{"type": "text", "text": '"city": "Oslo"}'}],
              "stop_reason": "end_turn", "usage": {"input_tokens": 5, "output_tokens": 5}}
    chat = orjson.loads(message_a2o(orjson.dumps(answer), "{"))
    assert json.loads(chat["choices"][0]["message"]["content"]) == {"city": "Oslo"}
    answer["content"] = [{"type": "text", "text": "Sure! Here it is"}]
    with pytest.raises(SlipstreamError, match="not valid JSON") as invalid:
        message_a2o(orjson.dumps(answer), "{")
    assert invalid.value.status == 502
    answer["stop_reason"] = "max_tokens"  # cut short: passed on as OpenAI's JSON mode does, with finish_reason length
    assert orjson.loads(message_a2o(orjson.dumps(answer), "{"))["choices"][0]["finish_reason"] == "length"


def _policy(emulator_url: str) -> str:
    return f"""team: fields
api_keys: [{{value: "{KEY}"}}]
providers:
  claude: {{kind: anthropic, base_url: "{emulator_url}", api_key: "up-anthropic"}}
  gpt: {{kind: openai, base_url: "{emulator_url}/v1", api_key: "up-openai", responses: native}}
routes:
  - match: {{model: "old-claude"}}
    targets: [{{provider: claude, model: claude-3-5-haiku}}]
  - match: {{model: "claude-*"}}
    targets: [{{provider: claude, model: claude-sonnet-5}}]
  - match: {{model: "gpt-*"}}
    targets: [{{provider: gpt, model: gpt-4o}}]
provider_objects: [pmpt_1]  # a stored prompt the team may name (it is refused here as untranslatable)
"""


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("fields")
    (directory / "fields.yaml").write_text(_policy(emulator.url))
    with running_proxy([directory], watch_interval_s=None) as running:
        yield running.url


@pytest.fixture
def oa(proxy):
    return openai.OpenAI(base_url=f"{proxy}/v1", api_key=KEY, max_retries=0)



ASK = [{"role": "user", "content": "Weather in Oslo for 3 days?"}]


def test_fields_that_change_nothing_are_dropped_and_named(oa, fresh_emulator):
    raw = oa.responses.with_raw_response.create(
        model="claude-x", input="Hello", store=False, metadata={"run": "7"}, user="u-1", service_tier="auto",
        safety_identifier="s-1", include=["reasoning.encrypted_content"], reasoning={"effort": "low", "summary": "auto"},
        text={"verbosity": "medium"}, extra_body={"client_metadata": {"agent": "codex"}})  # what coding agents send
    assert raw.parse().output_text
    dropped = raw.headers[DROPPED_HEADER].split(",")
    assert {"store", "metadata", "service_tier", "client_metadata", "safety_identifier", "include.reasoning.encrypted_content",
            "reasoning.summary", "verbosity"} <= set(dropped)
    sent = _sent(fresh_emulator)
    assert sent["metadata"] == {"user_id": team_user("fields", "u-1")} and sent["output_config"] == {"effort": "low"}  # translated, not dropped
    assert not {"client_metadata", "store", "service_tier", "safety_identifier"} & set(sent)
    plain = oa.chat.completions.with_raw_response.create(model="claude-x", messages=ASK, n=1, presence_penalty=0)
    assert plain.headers[DROPPED_HEADER] == "n,presence_penalty"


def test_fields_that_would_change_the_answer_are_refused_naming_field_and_protocol(proxy, oa, fresh_emulator):
    with pytest.raises(openai.BadRequestError, match=r"'frequency_penalty' cannot be translated for an Anthropic target"):
        oa.chat.completions.create(model="claude-x", messages=ASK, frequency_penalty=0.5)
    an = anthropic.Anthropic(base_url=proxy, api_key=KEY, max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match=r"'top_k' cannot be translated for an OpenAI target"):
        an.messages.create(model="gpt-x", max_tokens=16, messages=ASK, extra_body={"top_k": 5})
    with pytest.raises(openai.BadRequestError, match=r"'prompt' cannot be translated for an Anthropic Messages target"):
        oa.responses.create(model="claude-x", input="Hi", extra_body={"prompt": {"id": "pmpt_1"}})
    assert fresh_emulator.state.recent == type(fresh_emulator.state.recent)()  # nothing was sent


def test_json_schema_reaches_claude_as_structured_outputs_json_object_as_an_instruction(oa, fresh_emulator):
    """Structured outputs have no "any object" (every object must close its properties): json_object is
    an instruction, with no prefill for a model that refuses one (4.6 and later), and the answer is
    validated as JSON."""
    answer = oa.chat.completions.create(model="claude-x", messages=ASK, response_format={"type": "json_object"})
    assert isinstance(json.loads(answer.choices[0].message.content or ""), dict)
    sent = _sent(fresh_emulator)
    assert "output_config" not in sent and "JSON object" in str(sent["system"]) and sent["messages"][-1]["role"] == "user"
    schema = {"type": "json_schema", "json_schema": {"name": "forecast", "schema": SCHEMA, "strict": True}}
    answer = oa.chat.completions.create(model="claude-x", messages=ASK, response_format=schema)  # type: ignore[arg-type]
    assert set(json.loads(answer.choices[0].message.content or "")) == {"city", "days"}
    response = oa.responses.create(model="claude-x", input="Weather?", text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(response.output_text), dict)
    response = oa.responses.create(model="claude-x", input="Weather?",
                                   text={"format": {"type": "json_schema", "name": "forecast", "schema": SCHEMA}})
    assert set(json.loads(response.output_text)) == {"city", "days"}
    assert _sent(fresh_emulator)["output_config"]["format"]["schema"] == SCHEMA


def test_json_mode_to_a_claude_without_structured_outputs_is_an_instruction_and_a_prefill(oa, fresh_emulator):
    # The emulator's Claude follows the instruction, continuing the `{` (an answer that is not JSON is a
    # 502: test_a_json_mode_answer_from_a_prefilled_claude_gets_its_prefill_back_and_is_validated).
    answer = oa.chat.completions.create(model="old-claude", messages=ASK, response_format={"type": "json_object"})
    assert isinstance(json.loads(answer.choices[0].message.content or ""), dict)
    sent = _sent(fresh_emulator)
    assert sent["messages"][-1] == {"role": "assistant", "content": [{"type": "text", "text": "{"}]}
    assert "JSON object" in sent["system"][0]["text"] and "output_config" not in sent  # (planned: a list of blocks)
    stream = oa.chat.completions.create(model="old-claude", messages=ASK, response_format={"type": "json_object"}, stream=True)
    assert next(c.choices[0].delta.content for c in stream if c.choices) == "{"  # the prefill starts the answer


def test_structured_output_from_a_messages_client_reaches_an_openai_target(proxy, fresh_emulator):
    an = anthropic.Anthropic(base_url=proxy, api_key=KEY, max_retries=0)
    message = an.messages.create(model="gpt-x", max_tokens=64, messages=ASK,
                                 extra_body={"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}})
    assert set(json.loads(message.content[0].text)) == {"city", "days"}  # type: ignore[union-attr]
    assert _sent(fresh_emulator)["response_format"]["json_schema"]["schema"] == SCHEMA
