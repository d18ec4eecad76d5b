"""Ids a provider hands a team in an answer and reads back by id in a later request, with two teams
sharing one provider key (the emulator's `up-openai`): another team's id answers as one nobody made,
a 404, and nothing is sent upstream."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import orjson
import pytest

from gateway.testing import RunningServer, running_proxy
from tests.helpers import oai, wait_until, write_policy

A, B = "sk-alpha-answer-ids", "sk-beta-answer-ids"
SPOKEN = {"model": "gpt-4o-mini", "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[RunningServer]:
    directory: Path = tmp_path_factory.mktemp("answer-ids")
    write_policy(directory, "alpha", A, emulator.url)
    write_policy(directory, "beta", B, emulator.url)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path_factory.mktemp("answer-ids-data")))
        with running_proxy([directory]) as running:
            yield running


def _naming(audio_id: str) -> list[dict]:
    """A next turn that refers to an earlier spoken answer by its audio id (OpenAI's multi-turn audio)."""
    return [{"role": "user", "content": "Tell me my locker code."}, {"role": "assistant", "audio": {"id": audio_id}},
            {"role": "user", "content": "Say it again, slower."}]


def _sent(emulator, audio_id: str) -> list[str]:
    return [r["path"] for r in emulator.app.state.recent if audio_id.encode() in (r["body"] or b"")]


@pytest.mark.parametrize("stream", [False, True])
def test_another_teams_audio_cannot_be_named_by_id(proxy, fresh_emulator, stream):
    """An assistant message's `audio.id` has OpenAI read an earlier spoken answer from what it keeps for
    the account every team shares; it went upstream as sent, so a team continued from another team's
    audio. Audio ids the gateway answers a team with (a whole answer, or a stream's audio delta) are the
    team's; another team's id and a made-up one get the same 404, and nothing is sent."""
    alpha, beta = oai(proxy, A), oai(proxy, B)
    if stream:
        chunks = list(alpha.chat.completions.create(**SPOKEN, messages=_naming("x")[:1], stream=True))
        audio_id = next(c.choices[0].delta.audio.id for c in chunks if c.choices and c.choices[0].delta.audio)
    else:
        answer = alpha.chat.completions.create(**SPOKEN, messages=_naming("x")[:1])
        audio_id = answer.choices[0].message.audio.id
    fresh_emulator.app.state.recent.clear()

    refusals = []
    for named in (audio_id, "audio_0123456789abcdef"):
        with pytest.raises(openai.NotFoundError) as refused:
            beta.chat.completions.create(**SPOKEN, messages=_naming(named))
        refusals.append((refused.value.status_code, refused.value.response.text.replace(named, "ID")))
    assert refusals[0] == refusals[1]  # no oracle for ids
    assert "Audio with id 'ID' not found." in refusals[0][1]
    assert _sent(fresh_emulator, audio_id) == []  # the provider never saw the id under the shared key

    again = alpha.chat.completions.create(**SPOKEN, messages=_naming(audio_id))  # the owner's own audio
    assert again.choices[0].message.audio.id != audio_id
    assert _sent(fresh_emulator, audio_id) == ["/v1/chat/completions"]


def test_a_batch_line_cannot_name_another_teams_audio(proxy, fresh_emulator):
    """A batch's lines are read by the provider under the shared key too, into an output file the team reads."""
    audio_id = oai(proxy, A).chat.completions.create(**SPOKEN, messages=_naming("x")[:1]).choices[0].message.audio.id
    beta = oai(proxy, B)
    line = orjson.dumps({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",
                         "body": {**SPOKEN, "messages": _naming(audio_id)}})
    source = beta.files.create(file=("in.jsonl", line + b"\n"), purpose="batch")
    fresh_emulator.app.state.recent.clear()
    with pytest.raises(openai.NotFoundError, match="Audio with id"):
        beta.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert [r for r in fresh_emulator.app.state.recent if r["path"] == "/v1/batches"] == []  # no batch created


def test_audio_in_a_batchs_output_is_the_teams_once_read_through_the_gateway(proxy, fresh_emulator):
    """A batch line asking for a spoken answer gets an audio id in the batch's output file, which the
    team reads through the gateway. It was not recorded, so the team naming its own audio in a later
    turn got the 404 of someone else's; it is recorded as the output passes, and another team still
    gets the 404."""
    alpha, beta = oai(proxy, A), oai(proxy, B)
    line = orjson.dumps({"custom_id": "spoken", "method": "POST", "url": "/v1/chat/completions",
                         "body": {**SPOKEN, "messages": _naming("x")[:1]}})
    source = alpha.files.create(file=("in.jsonl", line + b"\n"), purpose="batch")
    batch = alpha.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_until(lambda: (b := alpha.batches.retrieve(batch.id)).status == "completed" and b, "the batch completes")
    assert done.output_file_id is not None
    output = orjson.loads(alpha.files.content(done.output_file_id).read().splitlines()[0])
    audio_id = output["response"]["body"]["choices"][0]["message"]["audio"]["id"]
    again = alpha.chat.completions.create(**SPOKEN, messages=_naming(audio_id))  # before: a 404
    assert again.choices[0].message.audio.id != audio_id
    assert _sent(fresh_emulator, audio_id) == ["/v1/chat/completions"]
    with pytest.raises(openai.NotFoundError, match="Audio with id"):
        beta.chat.completions.create(**SPOKEN, messages=_naming(audio_id))
