"""`GET /readyz`: 503 with each part's state until what the served policies need is loaded, then 200;
`GET /healthz` answers throughout (liveness)."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx

from gateway.testing import running_proxy
from sdk.readiness import Readiness, WarmUp
from tests.helpers import requires_extra


async def test_parts_load_once_by_name_and_report_their_state():
    gate, loads = threading.Event(), []

    def load() -> None:
        loads.append(1)
        gate.wait(10)

    readiness = Readiness()
    readiness.start([WarmUp("model", load), WarmUp("model", load)])  # two teams, one model
    await asyncio.sleep(0.05)
    assert not readiness.ready and readiness.body() == {"status": "loading", "parts": {"model": {"state": "loading"}}}
    gate.set()
    await readiness.wait()
    assert readiness.ready and loads == [1]
    body = readiness.body()
    assert body["status"] == "ready" and body["parts"]["model"]["state"] == "ready" and body["parts"]["model"]["seconds"] >= 0


async def test_parts_load_one_at_a_time():
    """Concurrent loads can break on Python's import locks (sdk/readiness.py): the second part's load
    starts only after the first's returned."""
    first_running, second_started, overlapped = threading.Event(), threading.Event(), []

    def first() -> None:
        first_running.set()
        overlapped.append(second_started.wait(1.0))

    readiness = Readiness()
    readiness.start([WarmUp("first", first), WarmUp("second", second_started.set)])
    await readiness.wait()
    assert readiness.ready and first_running.is_set() and overlapped == [False]


async def test_a_part_that_fails_keeps_the_proxy_unready_and_says_why():
    def load() -> None:
        raise FileNotFoundError("no such model")

    readiness = Readiness()
    readiness.start([WarmUp("local engine '/nowhere'", load)])
    await readiness.wait()
    assert not readiness.ready
    assert readiness.body()["parts"]["local engine '/nowhere'"] == {"state": "failed", "seconds": readiness.parts["local engine '/nowhere'"].seconds,
                                                                   "error": "FileNotFoundError: no such model"}


def _write(tmp_path, providers: str, extra: str = "") -> None:
    (tmp_path / "team.yaml").write_text(
        f"team: ready\napi_keys: [{{value: sk-ready}}]\nproviders:\n{providers}\nroutes: [{{targets: [{{provider: local}}]}}]\n{extra}"
    )


def _wait_ready(url: str, timeout_s: float = 120) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        response = httpx.get(f"{url}/readyz")
        assert httpx.get(f"{url}/healthz").status_code == 200  # alive while loading
        if response.status_code == 200 or response.json()["status"] == "failed":
            return response
        assert response.status_code == 503 and response.json()["status"] == "loading"
        time.sleep(0.1)
    raise AssertionError("never ready")


@requires_extra("engine", "semantic")
def test_ready_only_after_the_demo_model_and_the_embedder_are_loaded(tmp_path):
    _write(tmp_path, "  local: {kind: local, model: demo}", "semantic_cache: {enabled: true}\n")
    with running_proxy([tmp_path]) as proxy:
        ready = _wait_ready(proxy.url)
        assert ready.status_code == 200, ready.text
        parts = ready.json()["parts"]
        assert set(parts) == {"local engine 'demo'", "embedder all-MiniLM-L6-v2 + QQP adapter"}
        assert all(part["state"] == "ready" and part["seconds"] >= 0 for part in parts.values())
        answer = httpx.post(f"{proxy.url}/v1/chat/completions", headers={"authorization": "Bearer sk-ready"}, timeout=60,
                            json={"model": "demo", "messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 4})
        assert answer.status_code == 200


@requires_extra("engine")
def test_a_model_that_cannot_load_is_reported_by_readyz(tmp_path):
    _write(tmp_path, f"  local: {{kind: local, model: '{tmp_path / 'missing-model'}'}}")
    with running_proxy([tmp_path]) as proxy:
        failed = _wait_ready(proxy.url)
        assert failed.status_code == 503
        part = failed.json()["parts"][f"local engine '{tmp_path / 'missing-model'}'"]
        assert part["state"] == "failed" and "missing-model" in part["error"]


def test_a_policy_that_needs_nothing_is_ready_at_once(tmp_path):
    _write(tmp_path, '  local: {kind: local, model: demo, base_url: "http://127.0.0.1:9/v1"}')
    with running_proxy([tmp_path]) as proxy:
        ready = httpx.get(f"{proxy.url}/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "ready" and ready.json()["parts"] == {}
        assert "teams" not in ready.json()  # no team names to the unauthenticated
