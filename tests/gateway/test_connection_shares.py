"""One team's many small requests in flight do not take every connection of the process (sdk/door/bodies.py):
each request counts at least its part of the body budget by the connection cap, so a team's share of the
budget is its share of the connections. Counted by their bytes alone, small slow requests were never
refused, one team's streams held every connection up to `--max-connections`, and another team's new
connection was answered 503 at the cap. Through the proxy with the official client, the emulator upstream."""

from __future__ import annotations

import contextlib
from pathlib import Path

import openai
import pytest

from emulator.testing import RunningEmulator
from gateway.edge import EdgeLimits
from gateway.testing import running_proxy
from tests.helpers import oai, write_policy

CAP = 8  # connections: each request counts 1/8 of the default budget, so a team alone holds 4 (half) in flight
ASK = {"model": "gpt-4.1", "max_completion_tokens": 2000, "messages": [{"role": "user", "content": "Tell a long story."}]}


def test_a_teams_small_streams_leave_another_team_connections(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fresh_emulator.config, "per_output_token_ms", 50.0)  # each stream lasts until its client leaves
    for team in ("alpha", "beta"):
        write_policy(tmp_path, team, f"sk-{team}-connections", fresh_emulator.url, extra="retry: {max_attempts: 1}\n")
    with running_proxy([tmp_path], edge=EdgeLimits(max_connections=CAP)) as proxy, contextlib.ExitStack() as streams:
        taken, refused = 0, 0
        for _ in range(CAP):  # each on a client (a connection) of its own, kept open while it streams
            client = streams.enter_context(oai(proxy, "sk-alpha-connections"))
            try:
                next(iter(streams.enter_context(client.chat.completions.create(**ASK, stream=True))))
                taken += 1
            except openai.RateLimitError as exc:  # answered at once: its connection is free for the next head
                assert "each request counts at least" in exc.message
                refused += 1
        assert (taken, refused) == (CAP // 2, CAP // 2)  # before: all 8 taken, every connection held
        beta = streams.enter_context(oai(proxy, "sk-beta-connections"))
        with beta.chat.completions.create(**ASK, stream=True) as stream:  # before: a 503 at the connection cap
            assert next(iter(stream)).choices is not None
