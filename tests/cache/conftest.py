"""Fixtures for the response cache: one real MiniLM per session, a fresh store per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdk.embedding import Embedder
from sdk.policy import load_policy
from sdk.runtime import TeamRuntime
from sdk.services import Services
from tests.helpers import write_policy


@pytest.fixture
def services(tmp_path: Path, embedder: Embedder, cache_embedder: Embedder) -> Services:
    services = Services(data_dir=tmp_path / "data")
    services._embedder = embedder  # the models are process-wide in production too; load them once per session
    services._cache_embedder = cache_embedder
    return services


@pytest.fixture
def runtime_for(tmp_path: Path, services: Services, fresh_emulator):
    """Build a team's runtime against the emulator, with `semantic_cache` set from a YAML flow mapping."""

    def build(team: str = "search", cache: str = "{enabled: true}", services: Services = services) -> TeamRuntime:
        path = write_policy(tmp_path, team, f"key-{team}", fresh_emulator.url, extra=f"semantic_cache: {cache}\n")
        return TeamRuntime.build(load_policy(path), services)

    return build
