"""Shared fixtures: the provider emulator and policy files that point at it."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator

import httpx
import pytest

from sdk.providers.upstream import close_upstream_for_running_loop
from tests.helpers import skip_without_extra

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Every run starts from an empty data folder (response cache, response store, embedding caches):
# state left by an earlier run under ~/.cache/slipstream would turn an expected miss into a hit.
if "SLIPSTREAM_DATA_DIR" not in os.environ:
    os.environ["SLIPSTREAM_DATA_DIR"] = tempfile.mkdtemp(prefix="slipstream-tests-")
    atexit.register(shutil.rmtree, os.environ["SLIPSTREAM_DATA_DIR"], ignore_errors=True)


# The fast tier (`pytest -m "not slow"`) leaves out whatever costs seconds of CPU a test: these
# folders and modules, and every test that loads MiniLM or a torch model. What is left checks the
# request path end to end against the emulator; the full suite is what CI runs.
SLOW_PATHS = {
    "tests/localengine/": "tiny torch models, Triton interpreted on the CPU",
    "tests/gpu/": "CUDA kernels and models",
    "tests/examples/": "each example runs in a subprocess with its own servers",
    "tests/install/": "fresh interpreters and the Dockerfile's steps",
    "tests/state/": "redis-server processes and pairs of proxies",
    "tests/gateway/test_cli.py": "`slipstream` commands in subprocesses",
    "tests/gateway/test_cli_behaviour.py": "`slipstream` commands in subprocesses",
    "tests/gateway/test_policy_cli.py": "`slipstream policy` in subprocesses",
    "tests/gateway/test_readiness.py": "model loads behind /readyz",
    "tests/gateway/test_status_page.py": "five one-second rounds of traffic, and a browser",
    "tests/gateway/test_fuzz.py": "a thousand generated requests",
    "tests/emulator/test_fuzz.py": "a thousand generated requests",
    "tests/gateway/test_hardening.py": "megabyte prompts",
    "tests/gateway/test_embeddings_models.py": "MiniLM served by the in-process local provider",
}
SLOW_FIXTURES = frozenset({"embedder", "cache_embedder", "model_dirs", "llama_dir"})  # MiniLM or torch loads


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        where = item.path.relative_to(root).as_posix()
        if any(where.startswith(path) for path in SLOW_PATHS) or SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def emulator() -> Iterator[object]:
    from emulator.testing import running_emulator

    with running_emulator() as running:
        yield running


@pytest.fixture(scope="session")
def embedder():
    """One real MiniLM for the whole session (cache, compression and shared-state tests)."""
    skip_without_extra("semantic")
    from sdk.embedding import Embedder

    model = Embedder()
    model.warm_up()
    return model


@pytest.fixture(scope="session")
def cache_embedder():
    """The response cache's MiniLM, with the shipped QQP adapter merged in (one for the session)."""
    skip_without_extra("semantic")
    from sdk.embedding import Embedder

    model = Embedder.for_cache()
    model.warm_up()
    return model


@pytest.fixture
def fresh_emulator(emulator):
    """The session's emulator with counters, faults and prompt cache cleared."""
    httpx.post(f"{emulator.url}/_emulator/reset").raise_for_status()
    return emulator


@pytest.fixture(autouse=True)
async def _close_upstream_pool():
    """Each async test has its own loop and the upstream pool is per loop: close it with the loop."""
    yield
    await close_upstream_for_running_loop()
