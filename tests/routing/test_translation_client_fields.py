"""Fields real clients send that a translated route refused or lost (a fifth audit of the translation).

The official clients through the proxy (team key "sk-routing"), the emulator as the upstream of the other protocol;
each test failed on the code before its fix.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests.routing.conftest import routed_proxy, sent

ROUTES = """  - match: {model: "claude-*"}
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
