"""Unit tests of the prompt-cache parts: canonical JSON, volatility, placement, marker writing."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import orjson
import pytest

from sdk.promptcache.blocks import anthropic_layout
from sdk.promptcache.canonicalize import canonicalize, sorted_json
from sdk.promptcache.placement import apply, min_cacheable_tokens, place
from sdk.promptcache.volatility import VolatilityDetector
from sdk.types import Protocol

LONG = "Follow the house style guide in every answer. " * 200


def test_prefix_digests_are_the_same_in_every_process():
    """Replicas share the ledger by these digests: Python's hash() would differ per PYTHONHASHSEED."""
    code = ("from sdk.promptcache.blocks import anthropic_layout; print(anthropic_layout({'model': 'm', 'system': 'rules', "
            "'messages': [{'role': 'user', 'content': 'hi'}]}).chain)")
    chains = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True,
                             text=True, check=True).stdout for seed in ("1", "2")}
    assert len(chains) == 1 and chains.pop().startswith("[")


def test_sorted_json_sorts_objects_keeps_lists_and_identity():
    schema = {"type": "object", "required": ["b", "a"], "properties": {"b": {"type": "string"}, "a": {"enum": [3, 1]}}}
    out = sorted_json(schema)
    assert list(out) == ["properties", "required", "type"]
    assert list(out["properties"]) == ["a", "b"]
    assert out["required"] == ["b", "a"] and out["properties"]["a"]["enum"] == [3, 1]
    assert sorted_json(out) is out  # already canonical: no copy


def test_canonicalize_never_mutates_the_callers_body():
    body = {
        "tools": [{"name": "t", "input_schema": {"type": "object", "properties": {"z": {}, "a": {}}}}],
        "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "1", "name": "t", "input": {"z": 1, "a": 2}}]}],
    }
    before = copy.deepcopy(body)
    out = canonicalize(Protocol.ANTHROPIC, body)
    assert body == before and orjson.dumps(body) == orjson.dumps(before)
    assert list(out["tools"][0]["input_schema"]["properties"]) == ["a", "z"]
    assert list(out["messages"][0]["content"][0]["input"]) == ["a", "z"]
    assert canonicalize(Protocol.ANTHROPIC, out) is out


def test_canonicalize_openai_parameters_and_arguments():
    body = {
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"y": {}, "x": {}}}}}],
        "messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"y": 1, "x": 2}'}}]}],
        "response_format": {"type": "json_schema", "json_schema": {"schema": {"properties": {"b": {}, "a": {}}}}},
    }
    out = canonicalize(Protocol.OPENAI, body)
    assert list(out["tools"][0]["function"]["parameters"]["properties"]) == ["x", "y"]
    assert out["messages"][0]["tool_calls"][0]["function"]["arguments"] == '{"x":2,"y":1}'
    assert out["response_format"] is body["response_format"]  # its key order is the answer's field order


def test_patterns_find_timestamps_ids_and_keep_dates_advisory():
    detector = VolatilityDetector()
    text = "You are helpful.\nCurrent time: 2026-05-01T10:22:03Z\nrequest_id: req_8f3a2b9c11\nKnowledge updated 2026-04-30\nBe brief."
    found = {f.line: (f.kind, f.movable) for f in detector.scan("system.0", text, None)}
    assert found == {1: ("timestamp", True), 2: ("request_id", True), 3: ("date", False)}


def test_learning_flags_a_line_that_varies_within_a_conversation():
    detector = VolatilityDetector()
    conv = b"c1"
    assert detector.scan("system.0", "Be kind.\nThe user's name is Alice.\nBe brief.", conv) == []
    found = detector.scan("system.0", "Be kind.\nThe user's name is Bob.\nBe brief.", conv)
    assert [(f.line, f.kind, f.movable) for f in found] == [(1, "learned", True)]
    # Another conversation with a different persona prompt is not compared with this one.
    assert detector.scan("system.0", "Be rude.\nAnything\nBe brief.", b"c2") == []


def _body(n_markers: int = 0, system_ttl: str | None = None) -> dict:
    messages = []
    for i in range(6):
        block = {"type": "text", "text": f"turn {i} " + "words " * 50}
        if i < n_markers:
            block["cache_control"] = {"type": "ephemeral"}
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": [block]})
    system = [{"type": "text", "text": LONG}]
    if system_ttl:
        system[0]["cache_control"] = {"type": "ephemeral", "ttl": system_ttl}
    return {"model": "claude-sonnet-5", "tools": [{"name": "t", "description": "d", "input_schema": {}}], "system": system, "messages": messages}


def _place(body, **kw):
    layout = anthropic_layout(body)
    args = dict(auto=True, ttl="5m", tail_ttl="5m", minimum=1024, ratio=1.0, volatile_from=None, tail_moved=False, anchor=-1)
    args.update(kw)
    return layout, place(layout, **args)


def test_auto_places_rolling_system_and_skips_prefixes_below_the_minimum():
    layout, placement = _place(_body())
    reasons = {m.reason: layout.blocks[m.index].path for m in placement.add}
    # messages.5, the assistant's, is a final assistant turn: a prefill, which the next turn holds whole
    assert reasons == {"rolling": "messages.4.content.0", "system": "system.0"}  # tools end is under 1024 tokens
    body = _body()
    body["messages"].append({"role": "user", "content": "and now?"})
    layout, placement = _place(body)
    assert {m.reason: layout.blocks[m.index].path for m in placement.add}["rolling"] == "messages.6.content"  # a string: one block


def test_more_than_four_client_markers_are_repaired():
    layout, placement = _place(_body(n_markers=5), auto=False)
    assert len(placement.marks) == 4 and len(placement.remove) == 1
    assert layout.blocks[placement.remove[0]].path == "messages.0.content.0"  # the oldest history marker
    body = apply(_body(n_markers=5), layout, placement)
    assert sum(1 for m in body["messages"] for b in m["content"] if "cache_control" in b) == 4


def test_ttl_order_bends_around_client_markers():
    # The client marks the system prompt 5m; a 1h policy TTL after it would be a 400 (A.9).
    layout, placement = _place(_body(system_ttl="5m"), ttl="1h")
    assert all(m.ttl == "5m" for m in placement.marks)
    # The client marks the system prompt 1h: its TTL is kept, ours before it become 1h.
    layout, placement = _place(_body(system_ttl="1h"), tail_ttl="5m")
    assert [(layout.blocks[m.index].section, m.ttl) for m in placement.marks] == [("system", "1h"), ("messages", "5m")]


def test_rolling_breakpoint_never_on_moved_or_after_volatile_content():
    layout, placement = _place(_body(), tail_moved=True)
    assert max(m.index for m in placement.marks) == len(layout.blocks) - 2
    layout, placement = _place(_body(), volatile_from=1)  # the system block still holds a timestamp
    assert [m.reason for m in placement.add] == []  # tools end is too short; nothing else is ever read


def test_apply_copies_and_converts_string_content():
    body = {"model": "m", "system": [{"type": "text", "text": LONG}], "messages": [{"role": "user", "content": "hi " * 1200}]}
    before = copy.deepcopy(body)
    layout, placement = _place(body)
    out = apply(body, layout, placement)
    assert body == before
    assert out["messages"][0]["content"] == [{"type": "text", "text": "hi " * 1200, "cache_control": {"type": "ephemeral"}}]


def test_model_minimums():
    assert min_cacheable_tokens("claude-opus-5") == 512
    assert min_cacheable_tokens("claude-haiku-4-5-20251001") == 4096
    assert min_cacheable_tokens("claude-opus-4-7") == 2048
    assert min_cacheable_tokens("something-else") == 1024


def test_money_saved_is_priced_like_spend():
    """A cache read saves the input price less the read price, a write costs its premium, at the
    prices spend charges (the policy's `pricing:` first); a model without a price saves nothing
    (a local model used to be counted at $3 per million tokens)."""
    from sdk.policy import Price
    from sdk.promptcache.stats import saved_usd
    from sdk.spend import price_of

    sonnet = price_of("claude-sonnet-4-5", {})
    assert saved_usd(sonnet, 1_000_000, 0) == pytest.approx(3.0 - 0.3)
    assert saved_usd(sonnet, 0, 1_000_000) == pytest.approx(-(3.75 - 3.0))
    assert saved_usd(price_of("smollm2-135m-instruct", {}), 1_000_000, 1_000_000) == 0.0
    own = {"smollm2*": Price(input=1.0, output=2.0, cache_read=0.25)}
    assert saved_usd(price_of("smollm2-135m-instruct", own), 1_000_000, 0) == pytest.approx(0.75)
