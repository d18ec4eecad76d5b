from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.testing import RunningServer, running_proxy
from tests.helpers import write_policy

TEAM_KEY = "sk-team-alpha"
# These tests check what passes through untouched, so the optimizing stages stay off.
PASS_THROUGH = "retry: {max_attempts: 2, base_delay_ms: 10, max_delay_ms: 50}\nprompt_cache: {enabled: false}\n"


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory, emulator):
    directory = tmp_path_factory.mktemp("policies")
    write_policy(directory, "alpha", TEAM_KEY, emulator.url, extra=PASS_THROUGH)
    return directory


@pytest.fixture(scope="module")
def proxy(policy_dir) -> Iterator[RunningServer]:
    with running_proxy([policy_dir]) as running:
        yield running
