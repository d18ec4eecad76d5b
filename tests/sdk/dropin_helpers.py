"""Helpers shared by the drop-in SDK tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from emulator.testing import RunningEmulator
from tests.helpers import write_policy as shared_write_policy

EMU_KEY = "emu-key"  # the only upstream key the emulator accepts


def write_policy(tmp_path: Path, emu: RunningEmulator, key: str) -> Path:
    """The drop-in tests' team: the emulator upstream with `key`, pass-through (optimizers off)."""
    extra = "retry: {max_attempts: 1}\nprompt_cache: {enabled: false}\n"
    return shared_write_policy(tmp_path, f"sdk-{key}", "sk-sdk-team", emu.url, extra=extra, upstream_key=key)


@contextlib.contextmanager
def slow_stream(emu: RunningEmulator, per_token_ms: float = 5.0, tokens: int = 2000) -> Iterator[None]:
    """Make replies long and paced (seconds), so a stream is still open when the test closes it."""
    emu.config.per_output_token_ms, emu.config.default_output_tokens = per_token_ms, tokens
    yield
