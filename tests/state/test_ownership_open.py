"""The ownership records' sweep of expired records is not run on the event loop.

Through the proxy with the official client, the emulator upstream. The host's ownership records (every
file, batch and spoken answer's audio id each team made, kept 400 days, in one SQLite file) were opened
on the event loop at the first request after a start, and opening deleted the expired ones: a scan of
every team's records, during which no team's request moved. The sweep runs at the first call, in the
heavy-work pool, with the other calls.
"""

from __future__ import annotations

from pathlib import Path

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk.state import ownership
from tests.helpers import oai, sqlite_statement_threads, write_policy

KEY = "sk-alpha-owners-open"


def test_the_expired_records_are_swept_off_the_loop(tmp_path: Path, fresh_emulator: RunningEmulator, monkeypatch) -> None:
    swept = sqlite_statement_threads(monkeypatch, ownership, "owners.sqlite3", "DELETE FROM records WHERE expires")
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))  # records of its own: opened by this test's proxy
    write_policy(tmp_path, "alpha", KEY, fresh_emulator.url)
    with running_proxy([tmp_path]) as proxy:
        client = oai(proxy, KEY)
        uploaded = client.files.create(file=("notes.txt", b"minutes"), purpose="user_data")
        assert client.files.retrieve(uploaded.id).id == uploaded.id
    assert swept == ["slipstream-heavy"]  # before: the event loop's thread (uvicorn's), when the records were opened
