"""Helpers shared by the drop-in SDK tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import yaml

from emulator.testing import RunningEmulator

EMU_KEY = "emu-key"  # the only upstream key the emulator accepts


def write_policy(tmp_path: Path, emu: RunningEmulator, key: str) -> Path:
    doc = {
        "team": "sdk-tests",
        "providers": {
            "emu-anthropic": {"kind": "anthropic", "base_url": emu.url, "api_key": key},
            "emu-openai": {"kind": "openai", "base_url": emu.openai_url, "api_key": key},
        },
        "routes": [
            {"match": {"model": "claude-*"}, "targets": [{"provider": "emu-anthropic"}]},
            {"match": {"model": "gpt-*"}, "targets": [{"provider": "emu-openai"}]},
        ],
        "retry": {"max_attempts": 1},
    }
    path = tmp_path / f"policy-{key}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@contextlib.contextmanager
def slow_stream(emu: RunningEmulator, per_token_ms: float = 5.0, tokens: int = 2000) -> Iterator[None]:
    """Make replies long and paced (seconds), so a stream is still open when the test closes it."""
    emu.config.per_output_token_ms, emu.config.default_output_tokens = per_token_ms, tokens
    yield
