"""Without Redis, a status-page logout holds for every worker of `slipstream serve --workers N
--local-state` and across a restart: the revocation is a record in the host's SQLite file under the
data directory (gateway/ui/auth.py, sdk/state/ownership.py:records_of). It was a flag in the state
backend, which without Redis is each process's memory: only the worker that took the logout refused
the copied cookie, and a restart accepted it again until it expired (12 hours)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.gateway.test_cli import serving
from tests.helpers import write_policy

ADMIN = "sessions-admin-key"


@contextmanager
def _proxy(tmp_path: Path, upstream: str, *options: str) -> Iterator[str]:
    """`slipstream serve` without Redis, its data under tmp_path/data, on a free port: yields its URL."""
    policies = tmp_path / "policies"
    policies.mkdir(exist_ok=True)
    write_policy(policies, "t", "sk-t", upstream)
    env = {"SLIPSTREAM_DATA_DIR": str(tmp_path / "data"), "SLIPSTREAM_STATE_URL": "", "SLIPSTREAM_ADMIN_KEY": ADMIN}
    with serving(policies, *options, env=env) as url:
        yield url


def _signed_in(url: str) -> str:
    return httpx.post(f"{url}/ui/login", data={"key": ADMIN}, headers={"connection": "close"}, timeout=30).cookies["slipstream_ui"]


def _logout(url: str, cookie: str) -> int:
    return httpx.post(f"{url}/ui/logout", cookies={"slipstream_ui": cookie}, headers={"connection": "close"}, timeout=30).status_code


def _page(url: str, cookie: str) -> int:
    """The page's data with a session cookie, on a fresh connection (under --workers, any worker takes it)."""
    return httpx.get(f"{url}/ui/data", cookies={"slipstream_ui": cookie}, headers={"connection": "close"}, timeout=30).status_code


def test_a_logged_out_session_is_refused_by_every_worker(tmp_path, fresh_emulator):
    with _proxy(tmp_path, fresh_emulator.url, "--workers", "2", "--local-state") as url:
        cookie = _signed_in(url)
        assert [_page(url, cookie) for _ in range(4)] == [200] * 4  # a session every worker accepts
        assert _logout(url, cookie) == 303
        assert [_page(url, cookie) for _ in range(12)] == [401] * 12


def test_a_restart_does_not_bring_a_logged_out_session_back(tmp_path, fresh_emulator):
    with _proxy(tmp_path, fresh_emulator.url) as url:
        cookie, other = _signed_in(url), _signed_in(url)
        assert _logout(url, cookie) == 303
        assert _page(url, cookie) == 401
    with _proxy(tmp_path, fresh_emulator.url) as url:
        assert (_page(url, cookie), _page(url, other)) == (401, 200)  # another sign-in is a session of its own
