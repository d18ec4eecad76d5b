"""Replayed answers parse with the official SDKs' own stream parsers, and fold back to what was stored."""

from __future__ import annotations

import anthropic
import httpx2 as httpx  # the official SDKs (anthropic>=2, openai>=3) are built on httpx2
import openai
import orjson

from sdk.cache.answers import StreamCapture, from_body, render_body, render_events
from sdk.types import Protocol

ANTHROPIC_MESSAGE = {
    "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-5",
    "content": [{"type": "text", "text": "Rayleigh scattering."}, {"type": "tool_use", "id": "tu_1", "name": "lookup", "input": {"q": "sky", "n": 2}}],
    "stop_reason": "tool_use", "stop_sequence": None,
    "usage": {"input_tokens": 12, "output_tokens": 9, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
}  # fmt: skip
OPENAI_MESSAGE = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "gpt-5-mini",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Rayleigh scattering.", "refusal": None, "annotations": []}, "logprobs": None, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}, "system_fingerprint": "fp_x",
}  # fmt: skip


def _client_transport(raw: bytes) -> httpx.Client:
    def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=raw)

    return httpx.Client(transport=httpx.MockTransport(respond))


def test_anthropic_stream_replay_parses_with_the_official_client():
    raw = b"".join(render_events(Protocol.ANTHROPIC, ANTHROPIC_MESSAGE, include_usage=False))
    client = anthropic.Anthropic(api_key="k", base_url="http://cache.test", http_client=_client_transport(raw))
    with client.messages.stream(model="claude-sonnet-5", max_tokens=10, messages=[{"role": "user", "content": "q"}]) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == "Rayleigh scattering."
    assert final.content[1].input == {"q": "sky", "n": 2}
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == 9 and final.usage.input_tokens == 12


def test_openai_stream_replay_parses_with_the_official_client_and_honours_include_usage():
    for include_usage in (True, False):
        raw = b"".join(render_events(Protocol.OPENAI, OPENAI_MESSAGE, include_usage=include_usage))
        client = openai.OpenAI(api_key="k", base_url="http://cache.test/v1", http_client=_client_transport(raw))
        chunks = list(client.chat.completions.create(model="gpt-5-mini", messages=[{"role": "user", "content": "q"}], stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Rayleigh scattering."
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        usage = [c.usage for c in chunks if c.usage is not None]
        assert (usage[0].total_tokens if usage else None) == (15 if include_usage else None)
    assert raw.endswith(b"data: [DONE]\n\n")


def test_capture_folds_a_replayed_stream_back_to_the_stored_message():
    for protocol, message in ((Protocol.ANTHROPIC, ANTHROPIC_MESSAGE), (Protocol.OPENAI, OPENAI_MESSAGE)):
        capture = StreamCapture(protocol)
        for event in render_events(protocol, message, include_usage=True):
            capture.feed(event)
        assert capture.message() == message


def test_capture_refuses_unfinished_or_errored_streams():
    events = render_events(Protocol.ANTHROPIC, ANTHROPIC_MESSAGE, include_usage=False)
    cut = StreamCapture(Protocol.ANTHROPIC)
    for event in events[:-1]:
        cut.feed(event)
    assert cut.message() is None
    errored = StreamCapture(Protocol.OPENAI)
    for event in [*render_events(Protocol.OPENAI, OPENAI_MESSAGE, False)[:-1], b'data: {"error":{"message":"x"}}\n\n', b"data: [DONE]\n\n"]:
        errored.feed(event)
    assert errored.message() is None


def test_openai_body_replay_without_reported_usage_reports_zeros():
    body = render_body(Protocol.OPENAI, {**OPENAI_MESSAGE, "usage": None})
    assert openai.types.chat.ChatCompletion.model_validate_json(body).usage.total_tokens == 0


def test_capture_refuses_a_stream_with_deltas_it_cannot_replay():
    """Audio (or a legacy function_call) in a delta: stored without it, a hit would lack it; not stored."""
    events = render_events(Protocol.OPENAI, OPENAI_MESSAGE, False)
    audio = b'data: {"id":"chatcmpl-1","choices":[{"index":0,"delta":{"audio":{"id":"audio_1","data":"UklG"}},"logprobs":null,"finish_reason":null}]}\n\n'
    capture = StreamCapture(Protocol.OPENAI)
    for event in [events[0], audio, *events[1:]]:
        capture.feed(event)
    assert capture.message() is None


def test_a_streamed_answers_annotations_are_folded_and_replayed():
    """url_citation annotations stream in a chunk's `delta.annotations`: the capture keeps them (a stored
    answer without them would be served without its citations) and a replayed stream sends them again."""
    cited = {"type": "url_citation", "url_citation": {"start_index": 0, "end_index": 8, "url": "https://yr.no/1", "title": "Yr"}}
    choice = {**OPENAI_MESSAGE["choices"][0], "message": {**OPENAI_MESSAGE["choices"][0]["message"], "annotations": [cited]}}
    message = {**OPENAI_MESSAGE, "choices": [choice]}
    events = render_events(Protocol.OPENAI, message, include_usage=True)
    assert any(b'"annotations"' in event for event in events)
    capture = StreamCapture(Protocol.OPENAI)
    for event in events:
        capture.feed(event)
    assert capture.message() == message


def test_an_answer_with_audio_is_not_replayable():
    """An audio answer's `audio.id` is how the next turn refers to it, valid until its `expires_at` (OpenAI
    keeps it for a while); replayed from a cache that keeps entries for a day, the id may be gone and the
    client's next turn fails. (The emulator has no audio output, so this is checked on the body.)"""
    audio = {"id": "audio_1", "expires_at": 1700003600, "data": "UklGRg==", "transcript": "Rayleigh scattering."}
    choice = {**OPENAI_MESSAGE["choices"][0], "message": {**OPENAI_MESSAGE["choices"][0]["message"], "audio": audio}}
    body = orjson.dumps({**OPENAI_MESSAGE, "choices": [choice]})
    assert from_body(Protocol.OPENAI, body) is None
    assert from_body(Protocol.OPENAI, orjson.dumps(OPENAI_MESSAGE)) is not None
