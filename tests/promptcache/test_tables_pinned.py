"""The emulator's prompt-cache tables and prompt rendering equal the optimizer's.

Both sides keep their own copy on purpose: the emulator is an independent oracle of provider
behaviour and must not import the optimizer's rules (a shared mistake would then pass every test).
This test is what keeps the two copies equal: a change to one side fails here until the other side
(and the provider reference it cites) agrees.
"""

from __future__ import annotations

from typing import Any

import pytest

from emulator import caching as emulator
from emulator.app import EmulatorConfig
from sdk.promptcache import blocks, ledger, placement, tokens


def test_minimum_cacheable_tokens_table_is_the_same() -> None:
    assert emulator._MIN_TOKENS == placement._MIN_TOKENS
    assert emulator._SUFFIX.pattern == placement._SUFFIX.pattern


# every family both tables list, under each spelling the providers use (dated, -latest, Bedrock,
# Vertex, a router prefix), plus names neither table lists (the 1024 default)
_SPELLINGS = ("{}", "{}-20250101", "{}-latest", "anthropic.{}-v1:0", "ANTHROPIC/{}", "{}-extra")
_MODELS = [s.format(f) for f in sorted(emulator._MIN_TOKENS) for s in _SPELLINGS] + ["gpt-4o", "claude", "x", ""]


@pytest.mark.parametrize("model", _MODELS)
def test_minimum_cacheable_tokens_agree_for_every_spelling(model: str) -> None:
    assert emulator.min_cacheable_tokens(model) == placement.min_cacheable_tokens(model)


def test_anthropic_limits_and_ttls_are_the_same() -> None:
    config = EmulatorConfig()
    assert config.cache_lookback == placement.LOOKBACK == ledger.LOOKBACK
    assert config.max_breakpoints == placement.MAX_BREAKPOINTS
    assert emulator.TTL_SECONDS == ledger.TTL_S
    assert emulator.IMAGE_TOKENS == tokens.IMAGE_TOKENS


def test_openai_prefix_steps_are_the_same() -> None:
    assert (emulator.OPENAI_MIN, emulator.OPENAI_STEP) == (ledger.OPENAI_MIN, ledger.OPENAI_STEP)
    # the optimizer predicts the short end of OpenAI's "5-10 min idle" retention on purpose, so it
    # never predicts a read the provider would miss; it must never predict longer than the emulator keeps
    assert EmulatorConfig().openai_cache_ttl_s >= ledger.OPENAI_TTL_S


_SETTINGS: list[dict[str, Any]] = [
    {},
    {"tool_choice": {"type": "auto"}},
    {"tool_choice": {"type": "auto", "disable_parallel_tool_use": False}},
    {"tool_choice": {"type": "any", "disable_parallel_tool_use": True}},
    {"tool_choice": {"type": "tool", "name": "f"}},
    {"thinking": {"type": "disabled"}},
    {"thinking": {"type": "enabled", "budget_tokens": 2048}},
    {"thinking": None},
    {"output_config": {"effort": "high"}},
    {"output_config": {"effort": "low"}},
    {"output_config": {}},
    {"tool_choice": {"type": "none"}, "thinking": {"type": "enabled", "budget_tokens": 1024}, "output_config": {"effort": "medium"}},
]


@pytest.mark.parametrize("body", _SETTINGS)
def test_settings_salt_is_the_same(body: dict[str, Any]) -> None:
    """The settings folded into the prefix before `messages` (A.7) normalise the same way."""
    assert emulator._settings_salt(body) == blocks._settings_salt(body)


_BLOCKS: list[dict[str, Any]] = [
    {"type": "text", "text": "Hello", "cache_control": {"type": "ephemeral"}},
    {"type": "text", "text": ""},
    {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"b": 1, "a": [2, 3]}},
    {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}},
    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"},
    {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True, "content": [{"type": "text", "text": "no"}, {"type": "text", "text": "such"}]},
    {"type": "thinking", "thinking": "step by step", "signature": "sig"},
    {"type": "redacted_thinking", "data": "opaque"},
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "a plain document"}},
    {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}},
    {"type": "search_result", "title": "t", "source": "s", "content": [{"type": "text", "text": "x"}]},
]


@pytest.mark.parametrize("block", _BLOCKS, ids=lambda b: str(b["type"]))
def test_anthropic_blocks_render_the_same(block: dict[str, Any]) -> None:
    """What is counted and hashed for a content block, and whether it has the fixed (image) cost."""
    text, fixed = emulator._render_content_block(block)
    assert (text, fixed is not None) == blocks.render_anthropic_block(block)


@pytest.mark.parametrize("tool", [
    {"name": "lookup", "description": "Find it", "input_schema": {"type": "object", "properties": {"z": {}, "a": {}}}},
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 3, "cache_control": {"type": "ephemeral"}},
], ids=["client", "server"])
def test_anthropic_tools_render_the_same(tool: dict[str, Any]) -> None:
    assert emulator._render_tool(tool) == blocks._render_tool(tool)


def test_openai_prompts_render_the_same() -> None:
    """Tools, the response schema, then one part per message (images aside: the emulator stands an
    image in by a digest of its URL, the optimizer by the part's JSON; both stay stable across turns)."""
    body: dict[str, Any] = {
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}},
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "name": "ann", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                                                  "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
        ],
    }
    assert emulator.openai_prompt_parts(body) == [b.text for b in blocks.openai_layout(body).blocks]
