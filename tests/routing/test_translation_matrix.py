"""Prompt caching across protocols: every door × target protocol against the native request.

Through the proxy with the official clients, a conversation with a long system prompt is sent
twice (its first turn, then its second) from each door (Chat Completions, Messages, Responses) to
each target protocol (Anthropic Messages, OpenAI Chat Completions, OpenAI Responses). Per cell the
body the emulator received must carry the same breakpoints (Anthropic `cache_control` at the same
places) or the same `prompt_cache_key` as the native request to that target, the second turn must
read as many cached tokens, the client must see them in its own usage shape, and the
`x-slipstream-prompt-cache` header must predict them by the target provider's rules.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import pytest

from gateway.testing import running_proxy

SYSTEM = "You are the field-service assistant of ACME.\n" + "Answer from the service manual and cite the section. " * 300
QUESTIONS = ["How do I reset the pump controller? " * 10, "And how do I bleed the hydraulic line afterwards? " * 10]
ANSWER = "Hold the reset key for five seconds, then wait for the green light."
# The route each target protocol is reached by; each cell is its own team (own ledger, own key).
TARGETS = {"anthropic": ("claude", "claude-sonnet-5"), "chat": ("gptchat", "gpt-4o"), "responses": ("gpt", "gpt-4o")}
DOORS = ("chat", "messages", "responses")
# Which door is the native request to each target protocol.
NATIVE = {"anthropic": "messages", "chat": "chat", "responses": "responses"}
# Responses requests reach a Chat-only or Anthropic provider by translation; Chat and Messages
# requests reach an OpenAI provider as Chat whatever its Responses mode.
CELLS = [(door, target) for target in TARGETS for door in DOORS if target != "responses" or door == "responses"]


def _policy(team: str, emulator_url: str) -> str:
    provider, model = TARGETS[team.split("-")[2]]
    return f"""team: {team}
api_keys: [{{value: "key-{team}"}}]
providers:
  claude: {{kind: anthropic, base_url: "{emulator_url}", api_key: "up-{team}"}}
  gpt: {{kind: openai, base_url: "{emulator_url}/v1", api_key: "up-{team}", responses: native}}
  gptchat: {{kind: openai, base_url: "{emulator_url}/v1", api_key: "up-{team}", responses: chat}}
routes:
  - match: {{model: "*"}}
    targets: [{{provider: {provider}, model: {model}}}]
"""


def _team(door: str, target: str) -> str:
    return f"m-{door}-{target}"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("matrix")
    for team in (_team(door, target) for door, target in CELLS):
        (directory / f"{team}.yaml").write_text(_policy(team, emulator.url))
    with running_proxy([directory], watch_interval_s=None) as running:
        yield running.url


@dataclass
class Turn:
    sent: dict[str, Any]  # the body the emulator received
    cached: int  # cached input tokens, read from the client's own usage shape
    header: dict[str, str]  # x-slipstream-prompt-cache


def _conversation(turn: int) -> list[tuple[str, str]]:
    out = [("user", QUESTIONS[0])]
    if turn:
        out += [("assistant", ANSWER), ("user", QUESTIONS[1])]
    return out


def _send(proxy: str, door: str, key: str, turn: int) -> tuple[int, dict[str, str]]:
    """One turn through `door` with the official client; (cached tokens in its shape, headers)."""
    turns = _conversation(turn)
    if door == "messages":
        client = anthropic.Anthropic(base_url=proxy, api_key=key, max_retries=0)
        raw = client.messages.with_raw_response.create(model="any-model", max_tokens=16, system=SYSTEM,
                                                       messages=[{"role": r, "content": c} for r, c in turns])
        return raw.parse().usage.cache_read_input_tokens or 0, dict(raw.headers)
    oa = openai.OpenAI(base_url=f"{proxy}/v1", api_key=key, max_retries=0)
    if door == "chat":
        raw_chat = oa.chat.completions.with_raw_response.create(
            model="any-model", max_tokens=16,
            messages=[{"role": "system", "content": SYSTEM}, *({"role": r, "content": c} for r, c in turns)])
        usage = raw_chat.parse().usage
        assert usage is not None and usage.prompt_tokens_details is not None
        return usage.prompt_tokens_details.cached_tokens or 0, dict(raw_chat.headers)
    raw_responses = oa.responses.with_raw_response.create(model="any-model", max_output_tokens=16, instructions=SYSTEM,
                                                          input=[{"role": r, "content": c} for r, c in turns])
    responses_usage = raw_responses.parse().usage
    assert responses_usage is not None
    return responses_usage.input_tokens_details.cached_tokens, dict(raw_responses.headers)


def _run(proxy: str, emulator, team: str, door: str) -> list[Turn]:
    out = []
    for turn in range(2):
        cached, headers = _send(proxy, door, f"key-{team}", turn)
        [sent] = [r for r in emulator.state.recent if r["headers"].get("x-api-key") == f"up-{team}"
                  or r["headers"].get("authorization") == f"Bearer up-{team}"][-1:]
        header = dict(part.split("=", 1) for part in headers["x-slipstream-prompt-cache"].split(";"))
        out.append(Turn(json.loads(sent["body"]), cached, header))
    return out


def _breakpoints(body: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Where `cache_control` markers sit: (system, block) or (message, block)."""
    marks: list[tuple[Any, ...]] = []
    system = body.get("system")
    for j, block in enumerate(system if isinstance(system, list) else ()):
        if "cache_control" in block:
            marks.append(("system", j))
    for i, message in enumerate(body.get("messages") or ()):
        content = message.get("content")
        for j, block in enumerate(content if isinstance(content, list) else ()):
            if isinstance(block, dict) and "cache_control" in block:
                marks.append(("messages", i, j))
    return marks


@pytest.mark.parametrize(("door", "target"), CELLS, ids=[f"{d}->{t}" for d, t in CELLS])
def test_the_target_gets_the_native_plan_reads_the_same_cache_and_the_client_sees_it(proxy, emulator, door, target):
    team = _team(door, target)
    native = _run(proxy, emulator, team, NATIVE[target])
    translated = _run(proxy, emulator, team, door)  # the same conversation again, through `door`
    for got, want in zip(translated, native, strict=True):
        if target == "anthropic":
            assert _breakpoints(got.sent) == _breakpoints(want.sent) and _breakpoints(got.sent)
        else:
            assert got.sent.get("prompt_cache_key") == want.sent.get("prompt_cache_key")
            assert "cache_control" not in json.dumps(got.sent)
        # It sees the read in its own usage shape, and (Chat and Messages bodies, which Slipstream plans;
        # a native Responses body goes as the client sent it) the read was predicted.
        assert got.header["read"] == str(got.cached)
        if target != "responses":
            assert got.header["expected_read"] == got.header["read"]
    assert native[0].cached == 0 and native[1].cached > 1000
    for got, want in zip(translated, native, strict=True):  # the same turn again reads what the native one cached
        written = int(want.header["read"]) + int(want.header["write"]) if target == "anthropic" else want.cached
        assert got.cached >= written and got.cached > 1000


def test_streamed_answers_report_the_cache_read_in_the_clients_shape(proxy, emulator):
    team = _team("chat", "anthropic")  # the cell's conversation is cached by now, or is written here
    native = _run(proxy, emulator, team, "messages")
    oa = openai.OpenAI(base_url=f"{proxy}/v1", api_key=f"key-{team}", max_retries=0)
    turns = [{"role": r, "content": c} for r, c in _conversation(1)]
    chunks = list(oa.chat.completions.create(model="any-model", max_tokens=16, stream=True, stream_options={"include_usage": True},
                                             messages=[{"role": "system", "content": SYSTEM}, *turns]))  # type: ignore[list-item]
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == native[1].cached + int(native[1].header["write"])
    events = list(oa.responses.create(model="any-model", max_output_tokens=16, instructions=SYSTEM, input=turns, stream=True))  # type: ignore[arg-type]
    completed = events[-1]
    assert completed.type in ("response.completed", "response.incomplete") and completed.response.usage is not None
    assert completed.response.usage.input_tokens_details.cached_tokens == usage.prompt_tokens_details.cached_tokens
