"""Fixtures for compression: team runtimes against the emulator, one real MiniLM per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdk.embedding import Embedder
from sdk.policy import load_policy
from sdk.runtime import TeamRuntime
from sdk.services import Services
from tests.helpers import write_policy


@pytest.fixture
def make_runtime(tmp_path: Path, embedder: Embedder, fresh_emulator):
    """A team runtime whose `compression:` is the given YAML flow mapping (prompt cache off unless asked)."""

    def build(compression: str, extra: str = "prompt_cache: {enabled: false}\n", team: str = "docs") -> TeamRuntime:
        path = write_policy(tmp_path, team, f"key-{team}", fresh_emulator.url, extra=f"compression: {compression}\n{extra}")
        services = Services(data_dir=tmp_path / "data")
        services._embedder = embedder  # process-wide in production too; load it once per test session
        return TeamRuntime.build(load_policy(path), services)

    return build
