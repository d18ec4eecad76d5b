from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.testing import RunningServer, running_proxy
from tests.helpers import write_policy

TEAM_KEY = "sk-team-alpha"


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory, emulator):
    directory = tmp_path_factory.mktemp("policies")
    write_policy(directory, "alpha", TEAM_KEY, emulator.url, extra="retry: {max_attempts: 2, base_delay_ms: 10, max_delay_ms: 50}\n")
    return directory


@pytest.fixture(scope="module")
def proxy(policy_dir) -> Iterator[RunningServer]:
    with running_proxy([policy_dir]) as running:
        yield running
