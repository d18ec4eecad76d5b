"""Routing tests: a TeamRuntime (or the proxy) in front of the session's emulator.

Two Anthropic-protocol targets on one emulator are told apart by model name ("claude-a",
"claude-b"), so a fault can be aimed at one of them with the emulator's model glob.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.testing import running_proxy
from sdk.policy import load_policy
from sdk.runtime import TeamRuntime
from sdk.types import Endpoint, LLMRequest

HELLO = [{"role": "user", "content": "hello there"}]


def policy_text(emulator_url: str, routes: str, extra: str = "") -> str:
    return f"""team: routing
api_keys: [{{value: "sk-routing"}}]
providers:
  claude: {{kind: anthropic, base_url: "{emulator_url}", api_key: "up-anthropic"}}
  gpt: {{kind: openai, base_url: "{emulator_url}/v1", api_key: "up-openai"}}
routes:
{routes}
{extra}"""


def routed_proxy(directory: Path, emulator_url: str, routes: str) -> Iterator[str]:
    """A proxy (its URL) serving policy_text's team with `routes`: what a module's `proxy` fixture yields from."""
    (directory / "routing.yaml").write_text(policy_text(emulator_url, routes))
    with running_proxy([directory], watch_interval_s=None) as running:
        yield running.url


def sent(emulator) -> dict[str, Any]:
    """The body the emulator received last."""
    return json.loads(emulator.state.recent[-1]["body"])


TWO_CLAUDES = """  - match: {model: "claude-*"}
    targets: [{provider: claude, model: claude-a}, {provider: claude, model: claude-b}]
  - match: {model: "gpt-*"}
    targets: [{provider: gpt}]"""


@pytest.fixture
def build_runtime(tmp_path: Path, fresh_emulator):
    def build(routes: str = TWO_CLAUDES, extra: str = "") -> TeamRuntime:
        path = tmp_path / "routing.yaml"
        path.write_text(policy_text(fresh_emulator.url, routes, extra))
        return TeamRuntime.build(load_policy(path))

    return build


def messages_request(stream: bool = False, model: str = "claude-x", **body) -> LLMRequest:
    return LLMRequest(Endpoint.MESSAGES, {"model": model, "max_tokens": 32, "messages": HELLO, "stream": stream, **body},
                      {"anthropic-version": "2023-06-01"})


def inject(emulator, fault: str, count: int = 1, model: str = "*") -> None:
    httpx.post(f"{emulator.url}/_emulator/faults", json={"fault": fault, "count": count, "match": {"model": model}}).raise_for_status()


async def collect(answer) -> bytes:
    """The whole body of an answer: a complete body, or every stream event joined."""
    if hasattr(answer, "body"):
        return answer.body
    try:
        return b"".join([event async for event in answer.events])
    finally:
        await answer.aclose()



@pytest.fixture
def an(proxy):
    """The official Anthropic client against the module's `proxy` (a URL), with policy_text's team key."""
    return anthropic.Anthropic(base_url=proxy, api_key="sk-routing", max_retries=0)


@pytest.fixture
def oa(proxy):
    """The official OpenAI client against the module's `proxy` (a URL), with policy_text's team key."""
    return openai.OpenAI(base_url=f"{proxy}/v1", api_key="sk-routing", max_retries=0)
