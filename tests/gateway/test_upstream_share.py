"""One team's slow streams cannot take the upstream connections another team needs (issue 25, item 5).

Two teams share one provider key and one origin (the emulator). The pool's cap per origin is made
small here (8) so that the default share of a team (a quarter of it: 2) is reached with a few
streams: team A asks for eight slow streams, holds two, and its other calls wait for its own
connections (then fail with a 502 that says so); team B still gets a connection and its answer.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from emulator.app import EmulatorConfig
from emulator.testing import running_emulator
from gateway.testing import running_proxy
from sdk.providers import http1

SHARED_UPSTREAM_KEY = "up-shared-org-key"
STREAM = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "a long story"}]}
QUICK = {"model": "gpt-4o", "max_tokens": 2, "messages": [{"role": "user", "content": "a short answer"}]}


async def _alpha_streams_beside_beta(client: httpx.AsyncClient, upstream: Any) -> list[httpx.Response]:
    """Alpha asks for eight slow streams; once two are open upstream, beta's quick call must be answered.
    Alpha's eight answers, after checking that it held its share of two and no more."""
    alpha = {"authorization": "Bearer sk-alpha"}

    async def open_stream() -> httpx.Response:
        request = client.build_request("POST", "/chat/completions", json=STREAM, headers=alpha)
        return await client.send(request, stream=True)

    streams = [asyncio.create_task(open_stream()) for _ in range(8)]
    await asyncio.to_thread(upstream.wait_for, lambda stats: stats["open_streams"] >= 2)
    answer = await client.post("/chat/completions", json=QUICK, headers={"authorization": "Bearer sk-beta"})
    assert answer.status_code == 200, answer.text  # beta got a connection while alpha's streams run
    outcomes = await asyncio.gather(*streams)
    assert sorted(response.status_code for response in outcomes) == [200, 200, 502, 502, 502, 502, 502, 502]  # alpha's share, no more
    return outcomes


def _team(directory: Path, team: str, key: str, emulator_url: str) -> None:
    (directory / f"{team}.yaml").write_text(f"""team: {team}
api_keys: [{{value: "{key}"}}]
providers:
  gpt: {{kind: openai, base_url: "{emulator_url}/v1", api_key: "{SHARED_UPSTREAM_KEY}", connect_timeout_s: 2}}
routes:
  - targets: [{{provider: gpt}}]
retry: {{max_attempts: 1}}
prompt_cache: {{enabled: false}}
""")


async def test_a_team_holding_its_share_of_slow_streams_leaves_another_team_a_connection(tmp_path: Path,
                                                                                       monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(http1, "_MAX_PER_ORIGIN", 8)  # the pool's origin cap; a team's default share is 2
    slow = EmulatorConfig(per_output_token_ms=50.0, default_output_tokens=4000)  # each stream lasts minutes
    with running_emulator(slow) as emulator:
        _team(tmp_path, "alpha", "sk-alpha", emulator.url)
        _team(tmp_path, "beta", "sk-beta", emulator.url)
        with running_proxy([tmp_path]) as gateway:
            async with httpx.AsyncClient(base_url=f"{gateway.url}/v1", timeout=60, trust_env=False) as client:
                outcomes = await _alpha_streams_beside_beta(client, emulator)
                refused = [await r.aread() for r in outcomes if r.status_code == 502]
                assert all(b"holds all 2 of its connections" in body for body in refused)
                assert emulator.stats()["open_streams"] == 2
                for response in outcomes:
                    await response.aclose()


async def test_a_local_engine_over_http_is_shared_by_team_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A `kind: local` provider with a `base_url` (`slipstream engine serve`, which every team's
    requests share) reached the pool as nobody's: one team's slow streams took every connection to
    the engine and another team's call waited for one, then failed. It holds its team's share too."""
    monkeypatch.setattr(http1, "_MAX_PER_ORIGIN", 8)
    slow = EmulatorConfig(per_output_token_ms=50.0, default_output_tokens=4000)
    with running_emulator(slow) as engine:  # an OpenAI-compatible server, as the engine's is
        for team in ("alpha", "beta"):
            (tmp_path / f"{team}.yaml").write_text(f"""team: {team}
api_keys: [{{value: "sk-{team}"}}]
providers:
  engine: {{kind: local, base_url: "{engine.url}/v1", model: gpt-4o, connect_timeout_s: 2}}
routes:
  - targets: [{{provider: engine}}]
retry: {{max_attempts: 1}}
prompt_cache: {{enabled: false}}
""")
        with running_proxy([tmp_path]) as gateway:
            async with httpx.AsyncClient(base_url=f"{gateway.url}/v1", timeout=60, trust_env=False) as client:
                for response in await _alpha_streams_beside_beta(client, engine):
                    await response.aclose()
