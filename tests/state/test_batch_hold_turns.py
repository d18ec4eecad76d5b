"""One team's batch holds do not hold another team's batches, through the proxy.

Without Redis a budgeted team's batch create holds its worst cost in the spend file every worker of the
host shares, one transaction, which waits for the file's lock (another worker's hold) and its disk; the
hold is ended the same way once the batch exists. Both ran in asyncio's default thread pool, first come,
first served (and shared with every `to_thread` caller: policy reloads, /metrics), so a team creating
many batches at once made another team's batch create wait until every one of its holds had run. They
take turns by team now in a thread of their own (sdk/offload.py:FairPool).
"""

from __future__ import annotations

from pathlib import Path

import anthropic

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk.state import spend_file
from sdk.state.backend import BudgetCheck, Refusal
from sdk.state.local import LocalState
from sdk.state.spend_file import SpendFile
from tests.helpers import GatedTurns, write_policy

BUDGETED = 'pricing: {"claude-sonnet-4-6": {input: 3, output: 15}}\nbudget: {usd: 100, period: day}\n'
MSG = {"model": "claude-sonnet-4-6", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}


def _team(key: str) -> str:
    return "beta" if "beta" in key else "alpha"


def test_one_teams_many_batch_holds_do_not_hold_another_teams_batch(tmp_path: Path, monkeypatch,
                                                                  fresh_emulator: RunningEmulator) -> None:
    """alpha's 12 batch holds wait on the spend file (a slow disk) until beta's is asked for: on the old
    code beta's ran after every one of alpha's the default pool had taken before it; it is second or
    third now."""
    monkeypatch.setenv(spend_file.ENV, str(tmp_path / "spend.sqlite3"))
    write_policy(tmp_path, "alpha", "sk-alpha-batches", fresh_emulator.url, extra=BUDGETED)
    write_policy(tmp_path, "beta", "sk-beta-batches", fresh_emulator.url, extra=BUDGETED)
    turns = GatedTurns()
    original, hold = SpendFile.hold_batch, LocalState._hold_batch

    async def asking(self: LocalState, lease: str, budget: BudgetCheck, file: SpendFile) -> Refusal | None:
        turns.asked.append(_team(budget.key))
        return await hold(self, lease, budget, file)

    def slow_disk(self: SpendFile, key: str, *args: object) -> float | None:
        return turns.held(_team(key), lambda: original(self, key, *args))  # type: ignore[arg-type]

    monkeypatch.setattr(LocalState, "_hold_batch", asking)
    monkeypatch.setattr(SpendFile, "hold_batch", slow_disk)
    with running_proxy([tmp_path], watch_interval_s=None) as proxy:
        alpha = anthropic.Anthropic(base_url=proxy.url, api_key="sk-alpha-batches", max_retries=0, timeout=60)
        beta = anthropic.Anthropic(base_url=proxy.url, api_key="sk-beta-batches", max_retries=0, timeout=60)

        def create(client: anthropic.Anthropic, cid: str) -> str:
            return client.messages.batches.create(requests=[{"custom_id": cid, "params": MSG}]).id  # type: ignore[list-item]

        turns.race(lambda i: create(alpha, f"a{i}"), lambda: create(beta, "b"), 12)
    assert sorted(turns.done) == sorted(["alpha"] * 12 + ["beta"])
    assert turns.done.index("beta") <= 2, turns.done  # after 11 of alpha's 12 on the old code
