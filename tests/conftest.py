"""Shared fixtures: the provider emulator and policy files that point at it."""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sdk.providers.upstream import close_upstream_for_running_loop
from tests.helpers import skip_without_extra

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# httpx's module-level helpers (`httpx.get(...)`, used by tests to read /metrics, /v1/models, ...)
# give up after 5 s by default: a wall-clock bound a loaded 2-core machine misses (a /metrics read
# timed out at load 14). Tests that mean a timeout pass their own, which still wins.
for _helper in ("request", "stream", "get", "options", "head", "post", "put", "patch", "delete"):
    setattr(httpx, _helper, functools.partial(getattr(httpx, _helper), timeout=120.0))
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
    "tests/cache/test_proxy_cache.py": "a proxy that loads MiniLM and the verifier",
    "tests/responses/test_quota.py": "mebibyte stores, turn after turn",
    "tests/responses/test_ownership.py::test_ownership_holds_across_replicas_over_redis": "a redis-server and two proxies",
    "tests/gateway/test_spend_isolation.py::test_two_replicas_over_redis": "a redis-server and two proxies",
    "tests/gateway/test_passthrough_budget.py::test_two_replicas_count_each_others_batches": "a redis-server and two proxies",
    "tests/gateway/test_tenant_references.py::test_two_replicas": "a redis-server and two proxies",
    "tests/gateway/test_tenant_references.py::test_a_long_list_page": "a redis-server and 20,000 listed files",
    "tests/gateway/test_tenant_references.py::test_naming_many_files": "a redis-server and a 200,000-part body",
    "tests/gateway/test_tenant_references.py::test_many_item_references": "a redis-server, two proxies and 300,000 references",
    "tests/gateway/test_tenant_references.py::test_a_turn_with_very_many_items": "a redis-server and a 300,000-item body",
    "tests/gateway/test_tenant_references.py::test_a_cache_hit": "a proxy that loads MiniLM and the verifier",
    "tests/gateway/test_edge_limits.py::test_admin_key": "`slipstream serve` in subprocesses",
    "tests/gateway/test_edge_limits.py::test_logout_revokes_the_session_on_every_replica": "a redis-server and two proxies",
    "tests/sdk/test_tracing_setup.py::test_off_means_no_opentelemetry_code_runs_at_all": "a fresh interpreter",
    "tests/emulator/test_control_and_cancel.py::test_python_dash_m_serves": "`python -m emulator` in a subprocess",
    "tests/compression/test_linear_tags.py::test_same_spans_as_the_lazy_regex": "300 generated texts through the old regex",
    "tests/promptcache/test_linear_scans.py::test_request_id_finds_what_the_old_pattern_found": "500 generated lines",
    "tests/compression/test_token_pruning.py": "the demo model scores every token",
    "tests/responses/test_frameworks.py": "three agent frameworks, each through both doors",
    # a client's timeout that must let a loaded machine deliver the request first: 2 s each, idle
    "tests/responses/test_responses_api.py::test_a_client_that_gives_up": "a 2 s client timeout per case",
    "tests/sdk/test_sdk_dropin.py::test_client_timeout_bounds_the_wait": "a 2 s client timeout per case",
}
SLOW_FIXTURES = frozenset({"embedder", "cache_embedder", "model_dirs", "llama_dir"})  # MiniLM or torch loads


def _slow(where: str) -> bool:
    """Whether a test (its node id) or a whole file or folder (its path) is in SLOW_PATHS."""
    return any(where.startswith(path) or f"{where}/".startswith(path) for path in SLOW_PATHS)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """For the fast tier, slow folders and modules are not even imported (torch alone takes seconds)."""
    if config.getoption("markexpr") != "not slow":
        return None
    return _slow(collection_path.relative_to(config.rootpath).as_posix()) or None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _slow(item.nodeid) or SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test whose policy the gateway refuses for a missing extra (sdk/extras.py: "needs the [X]
    extra") skips, naming it, as the README promises of the core-only install: the refusal is the
    product's own, so a test that lacks its `requires_extra` mark does not fail there."""
    outcome: Any = yield
    report = outcome.get_result()
    error = call.excinfo.value if call.excinfo is not None else None
    from sdk.errors import PolicyError

    if report.failed and isinstance(error, PolicyError) and (needed := _NEEDS_EXTRA.search(str(error))) is not None:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"this test needs the [{needed[1]}] extra: {error}")


_NEEDS_EXTRA = re.compile(r"needs the \[(\w+)\] extra")


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


@pytest.fixture
def pooled(monkeypatch: pytest.MonkeyPatch) -> list[Callable[..., Any]]:
    """The functions the heavy-work pool (sdk/offload.py) runs from now on, in order: tests of what
    runs off the event loop every team's requests share assert on it."""
    from sdk import offload

    ran: list[Callable[..., Any]] = []
    submit = offload.HEAVY_POOL.submit

    def recorded(fn: Callable[[], Any], tenant: str | None = None) -> Any:
        ran.append(getattr(fn, "func", fn))
        return submit(fn, tenant)

    monkeypatch.setattr(offload.HEAVY_POOL, "submit", recorded)
    return ran
