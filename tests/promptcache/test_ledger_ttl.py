"""A team's prompt-cache memory is let go once no provider cache can still hold what it describes.

The planner keeps, per team, the latest requests' block text (to explain a miss by the block that
changed), the cache entries they wrote, and a memo of analysed system prompts: up to 16 MiB of text
each, in the process every team shares, and kept however long the team stayed away, until the next
policy reload. No provider cache entry outlives an hour, so a request older than that explains no
miss: the proxy sweeps every team's planner (`TeamRegistry.sweep`) and what is older goes, the memo
too for a team that sent nothing for as long. Through the proxy with the official client.
"""

from __future__ import annotations

from pathlib import Path

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk import runtime
from sdk.promptcache import ledger
from sdk.promptcache.optimizer import Optimizer
from tests.helpers import oai, wait_until, write_policy

KEY = "sk-alpha-ledger-ttl"
SYSTEM = "You keep the minutes of the budget board and answer from them. " * 40


def test_a_teams_prompt_cache_memory_goes_once_it_has_outlived_every_provider_cache(
        tmp_path: Path, fresh_emulator: RunningEmulator, monkeypatch) -> None:
    made: list[Optimizer] = []
    init = Optimizer.__init__

    def recorded(self: Optimizer, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)  # type: ignore[arg-type]
        made.append(self)

    monkeypatch.setattr(Optimizer, "__init__", recorded)
    monkeypatch.setattr(runtime, "SWEEP_INTERVAL_S", 0.05, raising=False)
    write_policy(tmp_path, "alpha", KEY, fresh_emulator.url)
    with running_proxy([tmp_path], watch_interval_s=None) as proxy:
        client = oai(proxy, KEY)
        for turn in ("What was decided?", "And the date?"):
            client.chat.completions.create(model="gpt-4o", max_tokens=8, messages=[
                {"role": "system", "content": SYSTEM}, {"role": "user", "content": turn}])
        (optimizer,) = made
        held = optimizer.ledger
        assert held.history_chars > 0 and held.scopes and optimizer.detector._analyses  # kept while fresh
        monkeypatch.setattr(ledger, "HISTORY_TTL_S", 0.0, raising=False)  # an hour in production: everything is old now
        wait_until(lambda: not held.scopes and held.history_chars == 0 and not optimizer.detector._analyses,
                   "the team's history, entries and memo let go")  # before: kept until a reload
        # The team comes back: planned as a new one, its history remembered again.
        monkeypatch.setattr(ledger, "HISTORY_TTL_S", 3600.0)
        client.chat.completions.create(model="gpt-4o", max_tokens=8, messages=[
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": "Anything else?"}])
    assert held.history_chars > 0
