"""Anthropic prompt caching rules (reference A.4-A.11, E.3)."""

from __future__ import annotations

import asyncio

import anthropic
import pytest

from emulator import EmulatorConfig
from emulator.caching import min_cacheable_tokens
from emulator.testing import running_emulator

from .conftest import KEY
from .helpers import ANTHROPIC_HEADERS, HTTP, blocks, post, text_of

MODEL = "claude-sonnet-4-6"  # minimum 1024
T = 110  # tokens per block: 10 blocks = 1100 >= 1024


def usage(m) -> tuple[int, int, int]:
    u = m.usage
    return u.input_tokens, u.cache_creation_input_tokens, u.cache_read_input_tokens


def ask(anth, content, **kw):
    return anth.messages.create(model=kw.pop("model", MODEL), max_tokens=kw.pop("max_tokens", 8),
                                messages=[{"role": "user", "content": content}], **kw)


def test_write_then_read(anth):
    content = blocks(12, T, marked=(12,))
    first = ask(anth, content)
    assert usage(first) == (0, 12 * T, 0)
    assert first.usage.cache_creation.ephemeral_5m_input_tokens == 12 * T
    second = ask(anth, content + [{"type": "text", "text": text_of(7, 99)}])
    assert usage(second) == (7, 0, 12 * T)


def test_lookback_worked_example(anth):
    """A.8: writes at 10 and 15; turn 3 with 35 blocks misses (15 is outside 35..16)."""
    t1 = ask(anth, blocks(10, T, marked=(10,)))
    assert usage(t1) == (0, 10 * T, 0)
    t2 = ask(anth, blocks(15, T, marked=(15,)))
    assert usage(t2) == (0, 5 * T, 10 * T)
    t3 = ask(anth, blocks(35, T, marked=(35,)))
    assert usage(t3) == (0, 35 * T, 0)
    # With a second breakpoint at 15 the entry is found (different tail: 35 above was written).
    t3b = ask(anth, blocks(15, T, marked=(15,)) + blocks(20, T, marked=(20,), seed=5))
    assert usage(t3b) == (0, 20 * T, 15 * T)


def test_lookback_window_edge(anth):
    ask(anth, blocks(10, T, marked=(10,)))
    # Breakpoint at 29: window 29..10 (20 positions) includes 10.
    assert usage(ask(anth, blocks(29, T, marked=(29,))))[2] == 10 * T


def test_marker_moves_but_prefix_is_the_same(anth):
    ask(anth, blocks(10, T, marked=(10,)))
    moved = blocks(11, T, marked=(11,))  # block 10 no longer carries a marker
    assert usage(ask(anth, moved)) == (0, T, 10 * T)


def test_automatic_caching_top_level(anth):
    content = blocks(11, T)
    first = ask(anth, content, extra_body={"cache_control": {"type": "ephemeral"}})
    assert usage(first) == (0, 11 * T, 0)
    second = ask(anth, content + blocks(1, 5, seed=7),
                 extra_body={"cache_control": {"type": "ephemeral"}})
    assert usage(second) == (0, 5, 11 * T)


def test_five_breakpoints_rejected(anth):
    with pytest.raises(anthropic.BadRequestError) as ei:
        ask(anth, blocks(5, 10, marked=(1, 2, 3, 4, 5)))
    assert ei.value.body["error"]["message"] == (
        "A maximum of 4 blocks with cache_control may be provided. Found 5.")
    with pytest.raises(anthropic.BadRequestError) as ei:  # automatic one takes a slot
        ask(anth, blocks(5, 10, marked=(1, 2, 3, 4)), extra_body={"cache_control": {"type": "ephemeral"}})
    assert ei.value.body["error"]["message"].endswith("Found 5.")


def test_ttl_order_rejected(anth):
    tools = [{"name": "t", "description": "d", "input_schema": {"type": "object"},
              "cache_control": {"type": "ephemeral"}}]
    system = [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    with pytest.raises(anthropic.BadRequestError) as ei:
        anth.messages.create(model=MODEL, max_tokens=5, tools=tools, system=system,
                             messages=[{"role": "user", "content": "hi"}])
    msg = ei.value.body["error"]["message"]
    assert msg.startswith("system.0.cache_control.ttl: a ttl='1h' cache_control block must not "
                          "come after a ttl='5m' cache_control block.")
    assert "`tools`, `system`, `messages`" in msg


def test_mixed_ttl_billing_split(anth):
    system = [{"type": "text", "text": text_of(600, 1), "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    content = [{"type": "text", "text": text_of(500, 2), "cache_control": {"type": "ephemeral"}}]
    m = anth.messages.create(model=MODEL, max_tokens=5, system=system,
                             messages=[{"role": "user", "content": content}])
    assert m.usage.cache_creation.ephemeral_1h_input_tokens == 600
    assert m.usage.cache_creation.ephemeral_5m_input_tokens == 500
    assert m.usage.cache_creation_input_tokens == 1100


def test_marker_on_empty_text_rejected(emu):
    body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"},
        {"type": "text", "text": "", "cache_control": {"type": "ephemeral"}}]}]}
    r = post(emu.url, "/v1/messages", body, ANTHROPIC_HEADERS)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "messages.0.content.1.text: cache_control cannot be set for empty text blocks")


def test_below_minimum_is_silently_uncached(anth):
    m = ask(anth, blocks(1, 1000, marked=(1,)))
    assert usage(m) == (1000, 0, 0)
    h = ask(anth, blocks(1, 2000, marked=(1,)), model="claude-haiku-4-5")  # minimum 4096
    assert usage(h) == (2000, 0, 0)
    o = ask(anth, blocks(1, 600, marked=(1,)), model="claude-opus-5")  # minimum 512
    assert usage(o) == (0, 600, 0)


@pytest.mark.parametrize("model, minimum", [
    ("claude-opus-5", 512), ("claude-sonnet-5-20250929", 1024), ("claude-opus-4-20250514", 1024),
    ("claude-opus-4-7", 2048), ("claude-3-5-haiku-latest", 2048), ("claude-haiku-4-5", 4096),
    ("claude-opus-4-6", 4096), ("claude-opus-4-1-20250805", 1024), ("some-new-model", 1024),
])
def test_minimum_table(model, minimum):
    assert min_cacheable_tokens(model) == minimum


def test_ttl_expiry_and_refresh(anth, emu):
    content = blocks(10, T, marked=(10,))
    ask(anth, content)
    emu.advance_clock(200)
    assert usage(ask(anth, content))[2] == 10 * T  # hit refreshes: now expires at 200 + 300
    emu.advance_clock(200)
    assert usage(ask(anth, content))[2] == 10 * T
    emu.advance_clock(301)
    assert usage(ask(anth, content)) == (0, 10 * T, 0)  # expired: written again


def test_one_hour_ttl_survives_five_minutes(anth, emu):
    content = blocks(10, T)
    content[-1]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    assert ask(anth, content).usage.cache_creation.ephemeral_1h_input_tokens == 10 * T
    emu.advance_clock(1800)
    assert usage(ask(anth, content))[2] == 10 * T


def test_cache_scoped_per_key_and_model(anth, emu):
    content = blocks(10, T, marked=(10,))
    ask(anth, content)
    with anthropic.Anthropic(base_url=emu.url, api_key="other-workspace", max_retries=0) as other:
        assert usage(ask(other, content))[2] == 0
    assert usage(ask(anth, content, model="claude-opus-4-1"))[2] == 0
    assert usage(ask(anth, content))[2] == 10 * T


def test_tool_choice_change_keeps_tools_and_system(anth):
    tools = [{"name": "lookup", "description": text_of(400, 3),
              "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}]
    system = [{"type": "text", "text": text_of(700, 4), "cache_control": {"type": "ephemeral"}}]
    msgs = [{"role": "user", "content": blocks(3, 100, marked=(3,))}]
    first = anth.messages.create(model=MODEL, max_tokens=5, tools=tools, system=system, messages=msgs)
    w = first.usage.cache_creation_input_tokens  # tools (400 + name/schema) + 700 + 300
    assert usage(first) == (0, w, 0) and w > 1400
    same = anth.messages.create(model=MODEL, max_tokens=5, tools=tools, system=system, messages=msgs,
                                tool_choice={"type": "auto"})  # explicit default == omitted
    assert usage(same) == (0, 0, w)
    changed = anth.messages.create(model=MODEL, max_tokens=5, tools=tools, system=system,
                                   messages=msgs, tool_choice={"type": "none"})
    assert usage(changed) == (0, 300, w - 300)  # messages re-written, tools+system read


def test_schema_key_order_matters_but_body_order_does_not(emu):
    def body(props, order):
        tools = [{"name": "f", "description": text_of(1100, 5),
                  "input_schema": {"type": "object", "properties": props},
                  "cache_control": {"type": "ephemeral"}}]
        fields = {"model": MODEL, "max_tokens": 5, "tools": tools,
                  "messages": [{"role": "user", "content": "hi"}]}
        return {k: fields[k] for k in order}

    ab = {"a": {"type": "string"}, "b": {"type": "string"}}
    ba = {"b": {"type": "string"}, "a": {"type": "string"}}
    u1 = post(emu.url, "/v1/messages", body(ab, ["model", "max_tokens", "tools", "messages"]),
              ANTHROPIC_HEADERS).json()["usage"]
    u2 = post(emu.url, "/v1/messages", body(ab, ["messages", "tools", "max_tokens", "model"]),
              ANTHROPIC_HEADERS).json()["usage"]
    u3 = post(emu.url, "/v1/messages", body(ba, ["model", "max_tokens", "tools", "messages"]),
              ANTHROPIC_HEADERS).json()["usage"]
    assert u1["cache_creation_input_tokens"] > 0 and u1["cache_read_input_tokens"] == 0
    assert u2["cache_read_input_tokens"] == u1["cache_creation_input_tokens"]
    assert u3["cache_read_input_tokens"] == 0


def test_streaming_message_start_carries_cache_usage(anth):
    content = blocks(10, T, marked=(10,))
    ask(anth, content)
    with anth.messages.stream(model=MODEL, max_tokens=8,
                              messages=[{"role": "user", "content": content}]) as s:
        first = next(iter(s))
        assert first.type == "message_start"
        assert first.message.usage.cache_read_input_tokens == 10 * T
        final = s.get_final_message()
    assert usage(final) == (0, 0, 10 * T) and final.usage.output_tokens == 8


def test_total_input_equals_count_tokens(anth):
    content = blocks(12, T, marked=(5, 12)) + [{"type": "text", "text": "tail"}]
    m = ask(anth, content)
    n = anth.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": content}])
    assert sum(usage(m)) == n.input_tokens


async def test_entry_unreadable_until_writer_starts_responding():
    """A.9: parallel requests all miss; a later one reads."""
    cfg = EmulatorConfig(ttft_base_ms=150)
    with running_emulator(cfg) as e:
        content = blocks(10, T, marked=(10,))
        async with anthropic.AsyncAnthropic(base_url=e.url, api_key=KEY, max_retries=0) as c:
            async def one():
                return await c.messages.create(model=MODEL, max_tokens=4,
                                               messages=[{"role": "user", "content": content}])
            a, b = await asyncio.gather(one(), one())
            assert usage(a) == usage(b) == (0, 10 * T, 0)
            assert usage(await one()) == (0, 0, 10 * T)


def test_reset_clears_cache(anth, emu):
    content = blocks(10, T, marked=(10,))
    ask(anth, content)
    assert HTTP.post(emu.url + "/_emulator/reset").status_code == 200
    assert usage(ask(anth, content))[2] == 0
