"""The response cache never answers a request whose answer is the provider's own state, or hangs on it: a
Thread's turn (its id is what the next `continue` names; a `continue` follows a conversation the provider holds,
once), cache diagnostics (the id a later request is compared with; the reason the provider's cache missed, now),
a code-execution container, remote MCP servers, a Chat completion OpenAI is asked to store. Through the proxy with
the official clients, the emulator upstream; the teams cache everything else (exact tier, sampled answers too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from emulator.testing import RunningEmulator
from gateway.testing import RunningServer, running_proxy
from sdk.cache.stage import SKIP_HEADER, skip_reason
from sdk.types import Endpoint, LLMRequest
from tests.helpers import anth, oai, skip_without_extra, upstream, write_policy

skip_without_extra("semantic")  # the team's policy turns the response cache on (faiss)

TEAM, KEY = "stateful", "sk-stateful-cache"
BETA = "message-threads-2026-08-12"
MODEL = "claude-haiku-4-5"
FIRST = [{"role": "user", "content": "Our launch code is 7-4-1-9. Remember it."}]
CONTAINER = "container_011CZkY1w9Zq5YdJcC3kzB1n"  # made on the account without the gateway: the policy lists it
NEXT = [{"role": "user", "content": "What did I ask you to remember?"}]


@pytest.fixture
def proxy(tmp_path: Path, fresh_emulator: RunningEmulator, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    cached = ("prompt_cache: {enabled: false}\nsemantic_cache: {enabled: true, semantic: false, cache_sampled: true}\n"
              f"provider_objects: [{CONTAINER}]\n")
    with running_proxy([write_policy(tmp_path, TEAM, KEY, fresh_emulator.url, extra=cached)]) as running:
        yield running


def _ask(client: anthropic.Anthropic, stream: bool, messages: list[dict[str, Any]], **extra: Any) -> tuple[Any, dict[str, str]]:
    """A beta Messages request, whole or streamed: its answer and the answer's headers."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 200, "messages": messages, "betas": [BETA], **extra}
    if stream:
        with client.beta.messages.stream(**body) as events:
            return events.get_final_message(), dict(events.response.headers)
    raw = client.beta.messages.with_raw_response.create(**body)
    return raw.parse(), dict(raw.headers)


def _skips(proxy: RunningServer, reason: str) -> float:
    """The team's `slipstream_response_cache_skips_total` for `reason` (the process's, so tests compare)."""
    series = f'slipstream_response_cache_skips_total{{reason="{reason}",team="{TEAM}"}} '
    lines = [line for line in httpx.get(f"{proxy.url}/metrics").text.splitlines() if line.startswith(series)]
    return float(lines[0].removeprefix(series)) if lines else 0.0


def _messages_sent(emulator: RunningEmulator) -> int:
    return len(upstream(emulator, "/v1/messages"))


@pytest.mark.parametrize("stream", [False, True])
def test_a_thread_created_twice_is_created_twice(proxy: RunningServer, fresh_emulator: RunningEmulator, stream: bool) -> None:
    """The same `thread: {type: create}` asked again was an exact hit under a fresh `msg_` id the provider never
    issued and holds no Thread under: the client's `continue` from it was Anthropic's thread_not_found. Each is
    the provider's now, and the client continues from the one it was given."""
    client, skipped = anth(proxy, KEY), _skips(proxy, "thread")
    _ask(client, stream, FIRST, thread={"type": "create"})
    again, headers = _ask(client, stream, FIRST, thread={"type": "create"})
    followed, _ = _ask(client, stream, NEXT, thread={"type": "continue", "previous_message_id": again.id})  # before: 404
    assert followed.usage.input_tokens > 20  # the provider read the Thread's conversation with the new turn
    assert _messages_sent(fresh_emulator) == 3  # before: the second a hit
    assert headers["x-slipstream-cache"] == "miss" and headers[SKIP_HEADER] == "thread"
    assert _skips(proxy, "thread") == skipped + 3


def test_a_thread_continued_twice_is_the_providers_to_refuse(proxy: RunningServer, fresh_emulator: RunningEmulator) -> None:
    """An answer in a Thread is continued once; a second `continue` from it is Anthropic's 400
    thread_already_continued (the SDK's threads replay the conversation under a new Thread on it). The same
    `continue` asked again was an exact hit: an answer under an id holding no Thread, the refusal unseen."""
    client = anth(proxy, KEY)
    created, _ = _ask(client, False, FIRST, thread={"type": "create"})
    turn = {"thread": {"type": "continue", "previous_message_id": created.id}}
    _ask(client, False, NEXT, **turn)
    with pytest.raises(anthropic.BadRequestError) as refused:  # before: answered from the cache
        _ask(client, False, NEXT, **turn)
    assert refused.value.error_code == "thread_already_continued"


def test_cache_diagnostics_are_the_providers(proxy: RunningServer, fresh_emulator: RunningEmulator) -> None:
    """A request carrying `diagnostics` is answered with why the provider's prompt cache missed, now, under an id
    the next request names to be compared with. Asked again, it was a hit under an id the provider never saw: the
    next turn, naming it, was told `previous_message_not_found` instead of how its prompt compared."""
    client = anth(proxy, KEY)
    _ask(client, False, FIRST, diagnostics={"previous_message_id": None})
    again, headers = _ask(client, False, FIRST, diagnostics={"previous_message_id": None})
    turn = [*FIRST, {"role": "assistant", "content": "Noted."}, *NEXT]
    compared, _ = _ask(client, False, turn, diagnostics={"previous_message_id": again.id})
    assert compared.diagnostics is not None and compared.diagnostics.cache_miss_reason is None  # before: previous_message_not_found
    assert headers[SKIP_HEADER] == "diagnostics" and _messages_sent(fresh_emulator) == 3


@pytest.mark.parametrize("field", [
    {"container": CONTAINER},  # the files earlier requests' code left in it
    {"mcp_servers": [{"type": "url", "name": "tickets", "url": "https://mcp.example.com/sse"}]},  # tools it lists and runs
])
def test_a_request_naming_provider_held_tools_is_asked_each_time(proxy: RunningServer, fresh_emulator: RunningEmulator,
                                                                 field: dict[str, Any]) -> None:
    """A code-execution container by id and remote MCP servers are state the key does not hold (the
    container's files, the server's tools), and what they run has effects: the same request asked again was a hit."""
    client = anth(proxy, KEY)
    for _ in range(2):
        _, headers = _ask(client, False, FIRST, **field)
    assert _messages_sent(fresh_emulator) == 2  # before: 1
    assert headers[SKIP_HEADER] == next(iter(field))


def test_a_chat_completion_to_be_stored_reaches_openai(proxy: RunningServer, fresh_emulator: RunningEmulator) -> None:
    """`store: true` has OpenAI keep the completion (evals, distillation, retrieval by its id): a hit stored
    nothing, under an id OpenAI never issued. Without `store` the same question is the cache's."""
    client = oai(proxy, KEY)
    asked = {"model": "gpt-4.1-mini", "messages": FIRST, "temperature": 0}
    for _ in range(2):
        raw = client.chat.completions.with_raw_response.create(**asked, store=True)  # type: ignore[call-overload]
    assert len(upstream(fresh_emulator, "/chat/completions")) == 2  # before: 1
    assert raw.headers[SKIP_HEADER] == "store"
    for _ in range(2):
        plain = client.chat.completions.with_raw_response.create(**asked)  # type: ignore[call-overload]
    assert plain.headers["x-slipstream-cache"] == "exact-hit" and SKIP_HEADER not in plain.headers


@pytest.mark.parametrize("gone", ["at the provider", "through the gateway"])
def test_a_request_naming_a_file_by_id_is_the_providers_after_the_file_is_deleted(
        proxy: RunningServer, fresh_emulator: RunningEmulator, gone: str) -> None:
    """A Chat `file` part names a file the provider holds by its id; the key holds the id, not the file. A file
    deleted at the provider (it expired, or another tool on the account deleted it) left the same question an exact
    hit, answered from the deleted file, where OpenAI answers 404: such a request is asked each time and its answer
    not stored. Deleted through the gateway, the gateway's own ownership check answers the 404 (before too)."""
    client = oai(proxy, KEY)
    made = client.files.create(file=("notes.txt", b"The launch code is 7-4-1-9."), purpose="user_data")
    asked = {"model": "gpt-4.1-mini", "temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "file", "file": {"file_id": made.id}}, {"type": "text", "text": "What is the launch code?"}]}]}
    for _ in range(2):
        raw = client.chat.completions.with_raw_response.create(**asked)  # type: ignore[call-overload]
    if gone == "at the provider":
        httpx.delete(f"{fresh_emulator.url}/v1/files/{made.id}", headers={"authorization": "Bearer up-openai"}).raise_for_status()
    else:
        client.files.delete(made.id)
    with pytest.raises(openai.NotFoundError):  # before, deleted at the provider: an exact hit, the deleted file's answer
        client.chat.completions.create(**asked)  # type: ignore[call-overload]
    assert raw.headers["x-slipstream-cache"] == "miss" and raw.headers[SKIP_HEADER] == "file_id"
    assert len(upstream(fresh_emulator, "/chat/completions")) == (3 if gone == "at the provider" else 2)


THINK = {"model": "gpt-5-mini", "input": "Think about the number 41.", "reasoning": {"effort": "low"}, "max_output_tokens": 2000}


@pytest.mark.parametrize("by", ["previous_response_id", "input"])
def test_a_responses_hit_is_not_handed_out_with_reasoning_the_provider_reads_by_id(
        proxy: RunningServer, fresh_emulator: RunningEmulator, by: str) -> None:
    """A reasoning model's response holds a reasoning item that, without its `encrypted_content`, goes back by its
    id alone (the history `previous_response_id` expands, or the client's own next `input`), and OpenAI reads it
    from the responses stored on the account. A hit re-identified it: the next turn was OpenAI's 404 ("Item with id
    'rs_…' not found"). Such an answer is not stored; one asked with `include: ["reasoning.encrypted_content"]`
    carries its reasoning and is, and the next turn from its hit goes on."""
    client = oai(proxy, KEY)
    for include in ([], ["reasoning.encrypted_content"]):
        for _ in range(2):
            raw = client.responses.with_raw_response.create(**THINK, include=include)  # type: ignore[call-overload]
        answer = raw.parse()
        assert [item.type for item in answer.output] == ["reasoning", "message"]
        if by == "previous_response_id":  # before: the 404 after the hit without encrypted content
            client.responses.create(model="gpt-5-mini", previous_response_id=answer.id, input="Which number?")
        else:
            sent = [item.model_dump(exclude_none=True) for item in answer.output]
            client.responses.create(model="gpt-5-mini", input=[{"role": "user", "content": THINK["input"]}, *sent,
                                                               {"role": "user", "content": "Which number?"}])
        assert raw.headers["x-slipstream-cache"] == ("exact-hit" if include else "miss")


@pytest.mark.parametrize(("endpoint", "body", "reason"), [
    (Endpoint.MESSAGES, {"thread": {"type": "create"}}, "thread"),
    (Endpoint.MESSAGES, {"diagnostics": {"previous_message_id": None}}, "diagnostics"),
    (Endpoint.MESSAGES, {"thread": None, "mcp_servers": [], "container": None, "context_management": {"edits": []}}, None),
    (Endpoint.CHAT_COMPLETIONS, {"n": 2}, "n"),
    (Endpoint.CHAT_COMPLETIONS, {"store": True, "seed": 7}, "store"),
    (Endpoint.CHAT_COMPLETIONS, {"store": False, "seed": 7}, None),
    (Endpoint.RESPONSES, {"previous_response_id": "resp_1"}, "previous_response_id"),
    (Endpoint.RESPONSES, {"conversation": "conv_1"}, "conversation"),
    (Endpoint.RESPONSES, {"background": True}, "background"),
    (Endpoint.RESPONSES, {"prompt": {"id": "pmpt_1"}}, "prompt"),
    (Endpoint.RESPONSES, {"store": True, "background": False}, None),
    (Endpoint.MESSAGES, {"messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "file", "file_id": "file_011"}}]}]}, "file_id"),
    (Endpoint.MESSAGES, {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "image", "source": {"type": "file", "file_id": "file_011"}}]}]}]}, "file_id"),
    (Endpoint.MESSAGES, {"messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}}]}]}, None),
    (Endpoint.CHAT_COMPLETIONS, {"messages": [{"role": "user", "content": [
        {"type": "file", "file": {"file_id": "file-1"}}]}]}, "file_id"),
    (Endpoint.CHAT_COMPLETIONS, {"messages": [{"role": "user", "content": [
        {"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBE"}}]}]}, None),
    (Endpoint.RESPONSES, {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]}, "file_id"),
    (Endpoint.RESPONSES, {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]}, "file_id"),
])
def test_the_field_that_rules_a_request_out_is_named(endpoint: Endpoint, body: dict[str, Any], reason: str | None) -> None:
    assert skip_reason(LLMRequest(endpoint, {"model": "m", **body})) == reason
