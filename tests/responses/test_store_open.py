"""The SQLite Responses store is opened off the event loop.

Through the proxy with the official client, the emulator upstream. The store (every team's stored
responses, one SQLite file a host) was opened where it was first used, on the event loop every team's
requests share, at the first Responses request after a start: its schema, a migration from the older
format and a recount of every team's totals (a scan of the records table), during which no team's
request moved. The first call opens it now, in the store's thread, as that call's team's turn.
"""

from __future__ import annotations

from pathlib import Path

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk.responses import sqlite_store
from tests.helpers import oai, sqlite_statement_threads, write_policy

KEY = "sk-alpha-responses-open"


def test_the_responses_store_is_opened_and_recounted_off_the_loop(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                                   monkeypatch) -> None:
    opened = sqlite_statement_threads(monkeypatch, sqlite_store, "responses.sqlite3", "CREATE TABLE", "DELETE FROM stored_response_totals")
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))  # a store of its own: opened by this test's proxy
    write_policy(tmp_path, "alpha", KEY, fresh_emulator.url)
    with running_proxy([tmp_path]) as proxy:
        client = oai(proxy, KEY)
        first = client.responses.create(model="claude-sonnet-5", input="hello")
        second = client.responses.create(model="claude-sonnet-5", input="and again", previous_response_id=first.id)
        assert client.responses.retrieve(second.id).id == second.id
    assert opened and set(opened) == {"slipstream-response-store"}, opened  # before: the event loop's thread, once
