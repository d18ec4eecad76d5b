"""Responses objects and stream events the gateway builds (translated targets) are valid objects.

Each is validated with the official `openai` package's own types (`Response`, and every stream
event through `ResponseStreamEvent`), which refuse a missing required field, and checked for the
fields the Open Responses specification requires of a response object beyond them
(`completed_at`, `presence_penalty`, `frequency_penalty`, ...; function tools echoed with `strict`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.testing import running_proxy
from sdk.sse import event_data, events_of

KEY = "sk-spec"
# Required of a response object by the Open Responses specification (nullable ones included).
SPEC_REQUIRED = {"id", "object", "created_at", "completed_at", "status", "incomplete_details", "model", "previous_response_id",
                 "instructions", "output", "error", "tools", "tool_choice", "truncation", "parallel_tool_calls", "text",
                 "top_p", "presence_penalty", "frequency_penalty", "top_logprobs", "temperature", "reasoning", "usage",
                 "max_output_tokens", "max_tool_calls", "store", "background", "service_tier", "metadata",
                 "safety_identifier", "prompt_cache_key"}
TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("spec")
    (directory / "spec.yaml").write_text(f"""team: spec
api_keys: [{{value: "{KEY}"}}]
providers:
  claude: {{kind: anthropic, base_url: "{emulator.url}", api_key: "up-anthropic"}}
  chat: {{kind: openai, base_url: "{emulator.url}/v1", api_key: "up-openai", responses: chat}}
routes:
  - match: {{model: "claude-*"}}
    targets: [{{provider: claude, model: claude-sonnet-5}}]
  - match: {{model: "gpt-*"}}
    targets: [{{provider: chat, model: gpt-4o}}]
""")
    with running_proxy([directory], watch_interval_s=None) as running:
        yield running.url


def _valid(response: dict[str, Any], terminal: bool) -> None:
    Response.model_validate(response)
    assert not SPEC_REQUIRED - set(response), SPEC_REQUIRED - set(response)
    assert (response["completed_at"] is not None) == terminal
    for tool in response["tools"]:
        assert isinstance(tool["strict"], bool) and {"name", "description", "parameters"} <= set(tool)
    for item in response["output"]:
        if item["type"] == "message":
            assert all({"annotations", "logprobs"} <= set(part) for part in item["content"] if part["type"] == "output_text")


@pytest.mark.parametrize("model", ["claude-x", "gpt-x"])
@pytest.mark.parametrize("tools", [[], [TOOL]], ids=["text", "tool"])
def test_built_response_objects_and_events_are_valid(proxy, model, tools):
    body = {"model": model, "input": "Weather in Oslo? Use get_weather." if tools else "Hello", "tools": tools,
            "max_output_tokens": 40}
    headers = {"authorization": f"Bearer {KEY}"}
    answer = httpx.post(f"{proxy}/v1/responses", json=body, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    _valid(answer.json(), terminal=True)
    streamed = httpx.post(f"{proxy}/v1/responses", json={**body, "stream": True}, headers=headers, timeout=30)
    events = [json.loads(event_data(e)) for e in events_of(streamed.content) if event_data(e)]
    assert events[0]["type"] == "response.created" and events[-1]["type"] in ("response.completed", "response.incomplete")
    for event in events:
        EVENTS.validate_python(event)
        if "response" in event:
            _valid(event["response"], terminal=event is events[-1])
