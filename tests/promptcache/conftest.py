from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from sdk.policy import load_policy
from sdk.runtime import TeamRuntime
from tests.helpers import write_policy

_TEAMS = itertools.count()


@pytest.fixture
def make_runtime(tmp_path, fresh_emulator) -> Callable[[str], TeamRuntime]:
    """A TeamRuntime (fresh ledger, unique team name for the process-wide stats) against the emulator."""

    def make(prompt_cache: str = "{}", url: str | None = None) -> TeamRuntime:
        team = f"pc{next(_TEAMS)}"
        path = write_policy(tmp_path, team, f"key-{team}", url or fresh_emulator.url, extra=f"prompt_cache: {prompt_cache}\n")
        return TeamRuntime.build(load_policy(path))

    return make
