"""Without Redis, the workers of `slipstream serve --workers N --local-state` share the response
cache's file (sdk/cache/store.py): an answer one worker stored is an exact hit on every other at once,
and `DELETE /v1/slipstream/cache` drops every worker's entries. Each worker looked exact keys up in
its own map, built from the file when it started: the same request missed once on every worker (an
upstream call each, and the later stores failed on the file's unique key), and an invalidation
deleted only the entries of the worker that took it, so the others kept serving the answers the team
had just dropped."""

from __future__ import annotations

import os
import signal
import subprocess

import anthropic
import httpx

from gateway.testing import free_port
from tests.gateway.test_cli import ROOT, _command, _wait
from tests.helpers import requires_extra, write_policy

pytestmark = requires_extra("semantic")  # the response cache


def test_every_worker_serves_and_drops_the_same_cached_answers(tmp_path, fresh_emulator):
    policies = tmp_path / "policies"
    policies.mkdir()
    write_policy(policies, "t", "sk-t", fresh_emulator.url, extra="semantic_cache: {enabled: true, semantic: false, cache_sampled: true}\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([*_command(), "serve", "--policy-dir", str(policies), "--port", str(port), "--workers", "2",
                                "--local-state"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env={**os.environ, "SLIPSTREAM_DATA_DIR": str(tmp_path / "data"), "SLIPSTREAM_STATE_URL": ""})

    def ask(times: int) -> list[str]:
        """The same question `times` times, each on a fresh connection (any worker takes it): the cache status of each."""
        statuses = []
        for _ in range(times):
            with anthropic.Anthropic(base_url=url, api_key="sk-t", max_retries=0) as client:
                answer = client.messages.with_raw_response.create(model="claude-x", max_tokens=256,
                                                                  messages=[{"role": "user", "content": "the same question"}])
                statuses.append(answer.headers["x-slipstream-cache"])
        return statuses

    def upstream_calls() -> int:
        return int(fresh_emulator.stats()["endpoints"].get("POST /v1/messages", 0))

    try:
        _wait(f"{url}/healthz", process)
        assert ask(8) == ["miss"] + ["exact-hit"] * 7 and upstream_calls() == 1
        dropped = httpx.delete(f"{url}/v1/slipstream/cache", headers={"authorization": "Bearer sk-t", "connection": "close"}, timeout=30)
        assert dropped.json() == {"removed": 1}
        assert ask(8) == ["miss"] + ["exact-hit"] * 7 and upstream_calls() == 2
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
