"""Fixtures for the drop-in SDK tests: one emulator per module, a policy file pointing at it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from emulator.app import EmulatorConfig
from emulator.testing import RunningEmulator, running_emulator
from sdk.providers.upstream import close_upstream_for_running_loop
from tests.sdk.dropin_helpers import EMU_KEY, write_policy


@pytest.fixture(scope="module")
def _served() -> Iterator[RunningEmulator]:
    with running_emulator(EmulatorConfig(api_keys=frozenset({EMU_KEY}))) as emu:
        yield emu


@pytest.fixture
def emu(_served: RunningEmulator) -> Iterator[RunningEmulator]:
    """The module's emulator with fresh counters, caches and its default (instant) latency."""
    _served.reset()
    saved = (_served.config.per_output_token_ms, _served.config.default_output_tokens)
    yield _served
    _served.config.per_output_token_ms, _served.config.default_output_tokens = saved


@pytest.fixture
def policy(tmp_path: Path, emu: RunningEmulator) -> Path:
    """One team: claude-* to the emulator's Anthropic side, gpt-* to its OpenAI side."""
    return write_policy(tmp_path, emu, EMU_KEY)


@pytest.fixture
async def loop_pool() -> object:
    """Close this test loop's upstream pool at the end (the pool is per event loop)."""
    yield None
    await close_upstream_for_running_loop()
