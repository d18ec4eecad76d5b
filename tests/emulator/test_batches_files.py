"""Files, OpenAI batches, Anthropic message batches and legacy completions, through the
official clients."""

from __future__ import annotations

import json
import time

import openai
import pytest

from tests.helpers import PATIENCE_S

from .helpers import HTTP, OPENAI_HEADERS, post


def _line(cid: str, content: str, **body) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}],
                                **body}})


def _wait(fetch, done, timeout: float = PATIENCE_S):
    deadline = time.monotonic() + timeout
    while True:
        obj = fetch()
        if done(obj):
            return obj
        assert time.monotonic() < deadline, obj
        time.sleep(0.01)


def test_files_round_trip(oai):
    f = oai.files.create(file=("notes.txt", b"hello\nworld\n"), purpose="user_data")
    assert f.object == "file" and f.bytes == 12 and f.filename == "notes.txt" and f.status == "processed"
    assert oai.files.content(f.id).read() == b"hello\nworld\n"
    assert oai.files.retrieve(f.id).purpose == "user_data"
    assert [x.id for x in oai.files.list(purpose="user_data")] == [f.id]
    assert oai.files.delete(f.id).deleted
    with pytest.raises(openai.NotFoundError):
        oai.files.retrieve(f.id)
    with pytest.raises(openai.BadRequestError) as ei:
        oai.files.create(file=("x.txt", b"x"), purpose="memes")
    assert ei.value.param == "purpose"


def test_batch_round_trip(oai, emu):
    src = "\n".join([_line("a", "one"), _line("b", "two", max_tokens=5),
                     _line("bad", "three", temperature=9)])
    f = oai.files.create(file=("in.jsonl", src.encode()), purpose="batch")
    b = oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                           metadata={"job": "nightly"})
    assert b.object == "batch" and b.status == "validating" and b.metadata == {"job": "nightly"}
    b = _wait(lambda: oai.batches.retrieve(b.id), lambda x: x.status == "completed")
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (3, 2, 1)
    out = [json.loads(x) for x in oai.files.content(b.output_file_id).text.splitlines()]
    assert [o["custom_id"] for o in out] == ["a", "b"]
    assert out[1]["response"]["status_code"] == 200
    assert out[1]["response"]["body"]["choices"][0]["finish_reason"] == "length"
    # a line is answered exactly as a direct call: same model, same messages, same text
    direct = oai.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "one"}])
    assert out[0]["response"]["body"]["choices"][0]["message"]["content"] == direct.choices[0].message.content
    err = json.loads(oai.files.content(b.error_file_id).text)
    assert err["custom_id"] == "bad" and err["response"]["status_code"] == 400
    assert [x.id for x in oai.batches.list()] == [b.id]
    stored = HTTP.get(emu.url + "/_emulator/stats").json()["stored"]
    assert stored == {"responses": 0, "files": 3, "batches": 1}  # input, output and error files
    with pytest.raises(openai.BadRequestError):
        oai.batches.cancel(b.id)  # already completed


def test_batch_validation_and_cancel(oai, emu, monkeypatch):
    bad = oai.files.create(file=("in.jsonl", b"{not json}\n" + _line("x", "y").encode()), purpose="batch")
    b = oai.batches.create(input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert b.status == "failed" and b.errors.data[0].code == "invalid_json_line" and b.errors.data[0].line == 1
    with pytest.raises(openai.NotFoundError):
        oai.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
    monkeypatch.setattr(emu.config, "batch_delay_ms", 300)  # queued long enough to cancel
    good = oai.files.create(file=("in.jsonl", _line("x", "y").encode()), purpose="batch")
    b = oai.batches.create(input_file_id=good.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert oai.batches.cancel(b.id).status == "cancelling"
    b = _wait(lambda: oai.batches.retrieve(b.id), lambda x: x.status == "cancelled")
    assert b.request_counts.completed == 0 and b.output_file_id is None


def test_anthropic_message_batch(anth, emu, monkeypatch):
    params = {"model": "claude-sonnet-4-6", "max_tokens": 20,
              "messages": [{"role": "user", "content": "hi"}]}
    mb = anth.messages.batches.create(requests=[
        {"custom_id": "ok", "params": params},
        {"custom_id": "unknown-model", "params": dict(params, model="gpt-4o")}])
    assert mb.type == "message_batch" and mb.processing_status == "in_progress"
    mb = _wait(lambda: anth.messages.batches.retrieve(mb.id), lambda x: x.processing_status == "ended")
    assert (mb.request_counts.succeeded, mb.request_counts.errored) == (1, 1) and mb.results_url
    results = {r.custom_id: r.result for r in anth.messages.batches.results(mb.id)}
    assert results["ok"].type == "succeeded" and results["ok"].message.usage.output_tokens == 20
    assert results["unknown-model"].type == "errored"
    assert results["unknown-model"].error.error.type == "not_found_error"
    assert [x.id for x in anth.messages.batches.list()] == [mb.id]
    anth.messages.batches.delete(mb.id)
    monkeypatch.setattr(emu.config, "batch_delay_ms", 300)
    slow = anth.messages.batches.create(requests=[{"custom_id": "c", "params": params}])
    assert anth.messages.batches.cancel(slow.id).processing_status == "canceling"
    slow = _wait(lambda: anth.messages.batches.retrieve(slow.id), lambda x: x.processing_status == "ended")
    assert slow.request_counts.canceled == 1
    assert [r.result.type for r in anth.messages.batches.results(slow.id)] == ["canceled"]


def test_legacy_completions(oai, emu):
    r = oai.completions.create(model="gpt-3.5-turbo-instruct", prompt=["Say a", "Say b"], n=2,
                               max_tokens=5, logprobs=2)
    assert r.object == "text_completion" and [c.index for c in r.choices] == [0, 1, 2, 3]
    assert all(c.finish_reason == "length" for c in r.choices) and r.usage.completion_tokens == 20
    assert "".join(r.choices[0].logprobs.tokens) == r.choices[0].text
    assert oai.completions.create(model="gpt-3.5-turbo-instruct", prompt="x").usage.completion_tokens == 16
    text = "".join(c.choices[0].text for c in oai.completions.create(
        model="gpt-3.5-turbo-instruct", prompt=["Say a", "Say b"], max_tokens=5, stream=True) if c.choices[0].index == 1)
    assert text == r.choices[2].text
    bad = post(emu.url, "/v1/completions", {"model": "gpt-3.5-turbo-instruct", "prompt": {"x": 1}},
               OPENAI_HEADERS)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
