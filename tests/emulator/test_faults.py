"""Fault injection: error statuses with provider bodies/headers, resets, stalls, mid-stream faults."""

from __future__ import annotations

import time

import anthropic
import httpx2
import openai
import pytest

from emulator.faults import FaultSpecError, parse_fault
from tests.helpers import STALL_MS

from .conftest import KEY
from .helpers import ANTHROPIC_HEADERS, HTTP, OPENAI_HEADERS, post, sse_events

A_MODEL = "claude-sonnet-4-6"
O_MODEL = "gpt-5-mini"
MSGS = [{"role": "user", "content": "Hello"}]


def a_create(client, **kw):
    return client.messages.create(model=A_MODEL, max_tokens=16, messages=MSGS, **kw)


def o_create(client, **kw):
    return client.chat.completions.create(model=O_MODEL, messages=MSGS, **kw)


def fault(spec: str) -> dict:
    return {"extra_headers": {"x-emulator-fault": spec}}


def test_parse_specs():
    f = parse_fault("429:retry_after=2,retry_after_ms=1500")
    assert (f.status, f.retry_after, f.retry_after_ms) == (429, 2.0, 1500.0)
    f = parse_fault("stall:ms=50;midstream_error:events=3")
    assert f.stall_ms == 50 and f.midstream_after == 3
    assert parse_fault("overloaded").status == 529
    for bad in ("", "nope", "stall", "stall:ms=x", "429:retry_after", "200"):
        with pytest.raises(FaultSpecError):
            parse_fault(bad)


def test_429_with_retry_after(anth, oai, emu):
    with pytest.raises(anthropic.RateLimitError) as ei:
        a_create(anth, **fault("429:retry_after=2"))
    e = ei.value
    assert e.response.headers["retry-after"] == "2"
    assert e.body["type"] == "error" and e.body["error"]["type"] == "rate_limit_error"
    assert e.response.headers["request-id"] == e.body["request_id"]
    with pytest.raises(openai.RateLimitError) as oi:
        o_create(oai, **fault("429:retry_after_ms=1500"))
    assert oi.value.response.headers["retry-after-ms"] == "1500"
    assert oi.value.code == "rate_limit_exceeded"
    assert emu.stats()["faults_injected"] == 2


def test_529_overloaded_and_500(anth, oai):
    with pytest.raises(anthropic.OverloadedError) as ei:
        a_create(anth, **fault("529"))
    assert ei.value.status_code == 529 and ei.value.body["error"] == {
        "type": "overloaded_error", "message": "Overloaded"}
    with pytest.raises(anthropic.InternalServerError) as ei:
        a_create(anth, **fault("500"))
    assert ei.value.body["error"]["type"] == "api_error"
    with pytest.raises(openai.InternalServerError) as oi:
        o_create(oai, **fault("529"))
    assert oi.value.status_code == 503 and oi.value.type == "server_error"
    with pytest.raises(openai.InternalServerError) as oi:
        o_create(oai, **fault("500"))
    assert oi.value.status_code == 500


def test_sdk_retries_honour_retry_after_ms(emu):
    emu.inject_fault("429:retry_after_ms=20", count=1, path="/v1/messages")
    with anthropic.Anthropic(base_url=emu.url, api_key=KEY, max_retries=1) as c:
        raw = c.messages.with_raw_response.create(model=A_MODEL, max_tokens=4, messages=MSGS)
    assert raw.parse().stop_reason == "max_tokens" and raw.retries_taken == 1
    assert emu.stats()["statuses"] == {"429": 1, "200": 1}


def test_reset_is_a_connection_error(anth, oai):
    with pytest.raises(anthropic.APIConnectionError):
        a_create(anth, **fault("reset"))
    with pytest.raises(openai.APIConnectionError):
        o_create(oai, **fault("reset"))
    assert a_create(anth).stop_reason  # the server keeps serving


def test_stall_delays_first_byte(anth, emu):
    t = time.perf_counter()
    a_create(anth, **fault("stall:ms=250"))
    assert time.perf_counter() - t >= 0.25  # a lower bound: load only adds
    # The stall outlasts the test; the client's timeout leaves a loaded machine ample time to
    # deliver the request first, so there is a call to cancel.
    with pytest.raises(anthropic.APITimeoutError):
        anth.with_options(timeout=2).messages.create(
            model=A_MODEL, max_tokens=4, messages=MSGS, **fault(f"stall:ms={STALL_MS}"))
    emu.wait_for(lambda s: s["cancelled_requests"] == 1)


def test_queued_faults_match_model_and_path(emu, anth, oai):
    r = HTTP.post(emu.url + "/_emulator/faults", json={
        "fault": "529", "count": 2, "match": {"model": "claude-*", "path": "/v1/messages"}})
    assert r.status_code == 200
    assert o_create(oai).choices  # other path/model: untouched
    for _ in range(2):
        with pytest.raises(anthropic.OverloadedError):
            a_create(anth)
    assert a_create(anth).content  # count exhausted
    bad = HTTP.post(emu.url + "/_emulator/faults", json={"fault": "wat"})
    assert bad.status_code == 400 and "unknown fault" in bad.json()["error"]


def test_stream_only_fault_skips_non_streaming(emu, anth):
    emu.inject_fault("midstream_error:events=2", path="/v1/messages")
    assert a_create(anth).content  # not consumed by a non-streaming request
    with pytest.raises(anthropic.APIStatusError), anth.messages.stream(model=A_MODEL, max_tokens=16, messages=MSGS) as s:
        list(s)


def test_midstream_error_anthropic(emu, anth):
    body = {"model": A_MODEL, "max_tokens": 16, "messages": MSGS, "stream": True}
    r = post(emu.url, "/v1/messages", body,
             {**ANTHROPIC_HEADERS, "x-emulator-fault": "midstream_error:events=3"})
    evs = sse_events(r.text)
    assert r.status_code == 200 and len(evs) == 4
    assert evs[-1][0] == "error"
    assert evs[-1][1] == '{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    with pytest.raises(anthropic.APIStatusError) as ei, anth.messages.stream(model=A_MODEL, max_tokens=16, messages=MSGS,
                              **fault("midstream_error:events=4")) as s:
        list(s)
    assert ei.value.body["error"]["type"] == "overloaded_error"
    assert emu.stats()["errored_streams"] == 2


def test_midstream_error_openai(emu, oai):
    body = {"model": O_MODEL, "messages": MSGS, "stream": True}
    r = post(emu.url, "/v1/chat/completions", body,
             {**OPENAI_HEADERS, "x-emulator-fault": "midstream_error:events=2"})
    evs = sse_events(r.text)
    assert len(evs) == 3 and '"error"' in evs[-1][1] and "[DONE]" not in r.text
    with pytest.raises(openai.APIError):
        list(o_create(oai, stream=True, **fault("midstream_error:events=2")))


def test_disconnect_after_events(emu, anth, oai):
    # The anthropic SDK lets the transport error through once the body is being read.
    with pytest.raises((anthropic.APIConnectionError, httpx2.TransportError)), \
            anth.messages.stream(model=A_MODEL, max_tokens=16, messages=MSGS, **fault("disconnect_after:events=3")) as s:
        list(s)
    with pytest.raises(openai.APIConnectionError):
        list(o_create(oai, stream=True, **fault("disconnect_after:events=2")))
    s = emu.stats()
    assert s["errored_streams"] == 2 and s["completed_streams"] == 0 and s["cancelled_streams"] == 0


def test_bad_fault_header_is_a_400(emu):
    r = post(emu.url, "/v1/messages", {"model": A_MODEL, "max_tokens": 4, "messages": MSGS},
             {**ANTHROPIC_HEADERS, "x-emulator-fault": "explode"})
    assert r.status_code == 400 and "x-emulator-fault" in r.json()["error"]["message"]
