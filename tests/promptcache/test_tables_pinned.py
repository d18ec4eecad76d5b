"""The emulator's prompt-cache tables equal the optimizer's.

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
