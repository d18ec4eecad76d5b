"""Spend that outlives the process, for the in-process state backend (`slipstream serve` without Redis).

Budgets are per day or month, but in-process spend records lived as long as the process: a restart
(a deploy, a crash) set every team's spend back to nothing, and a team that had used its month's
budget had all of it again. `slipstream serve` without `--state-url` keeps them in a SQLite file
(`$SLIPSTREAM_DATA_DIR/spend.sqlite3`, or `SLIPSTREAM_SPEND_FILE`): every charge is added to the
file by a writer thread (the event loop never waits on the disk), which reads the live records back
once every REFRESH_S (`view`). The file holds sums, so the workers of
`--workers N --local-state` add theirs to the same records and each sees all of them within about a
second: a team's budget and its spend report are the host's, whichever worker answers. Read once
at start, each worker saw its own charges alone after that, and a team could spend its budget once
per worker.
"""

from __future__ import annotations

import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger("slipstream.state")

ENV = "SLIPSTREAM_SPEND_FILE"  # set by `slipstream serve` for its workers; an embedding program may set it too
_BATCH = 256  # charges written in one transaction at most
REFRESH_S = 1.0  # an idle writer reads the other workers' charges back this often

Records = dict[str, tuple[float, dict[str, float]]]  # key -> (expiry, {field: USD})


def spend_file_from_env() -> Path | None:
    path = os.environ.get(ENV)
    return Path(path) if path else None


class SpendFile:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS spend (key TEXT NOT NULL, field TEXT NOT NULL, usd REAL NOT NULL, "
                         "expires REAL NOT NULL, PRIMARY KEY (key, field))")
        self._charges: queue.SimpleQueue[tuple[str, float, tuple[str, ...], float] | None] = queue.SimpleQueue()
        self._queued = 0  # charges handed to the writer so far (by the event loop's thread)
        self._unwritten: list[tuple[str, float, tuple[str, ...], float]] = []  # charges a write failed to add: this process still counts them
        # (charges of this process the records include, every live record): replaced whole by the writer
        self.view: tuple[int, Records] = (0, self.load(time.time()))
        self._writer = threading.Thread(target=self._write, name="slipstream-spend-file", daemon=True)
        self._writer.start()

    def load(self, now: float) -> Records:
        """The live records; expired ones are deleted."""
        self._db.execute("DELETE FROM spend WHERE expires <= ?", (now,))
        return self._read(now)

    def add(self, key: str, expires: float, fields: Iterable[str], usd: float) -> int:
        """Add `usd` to each of the record's `fields` (in the writer thread, soon); returns the charge's
        number, which `view` counts once the records it holds include it."""
        self._charges.put((key, expires, tuple(fields), usd))
        self._queued += 1
        return self._queued

    def _read(self, now: float) -> Records:
        records: Records = {}
        for key, field, usd, expires in self._db.execute("SELECT key, field, usd, expires FROM spend WHERE expires > ?", (now,)):
            records.setdefault(key, (expires, {}))[1][field] = usd
        self._unwritten = [charge for charge in self._unwritten if charge[1] > now]
        for key, expires, fields, usd in self._unwritten:
            record = records.setdefault(key, (expires, {}))[1]
            for field in fields:
                record[field] = record.get(field, 0.0) + usd
        return records

    def close(self) -> None:
        """Write what is queued and stop the writer."""
        self._charges.put(None)
        self._writer.join(timeout=10)

    def _write(self) -> None:
        written, read_at = 0, time.monotonic()
        while True:
            # At most one read back every REFRESH_S, busy or idle: it reads every live record, and this
            # thread holds the GIL the event loop needs. Charges written since count in `_unsynced`.
            if time.monotonic() - read_at >= REFRESH_S:
                self._read_back(written)
                read_at = time.monotonic()
            try:
                charge = self._charges.get(timeout=REFRESH_S)
            except queue.Empty:  # nothing of ours to write: the loop's next turn reads the other workers' back
                continue
            batch = []
            while charge is not None:
                batch.append(charge)
                if len(batch) >= _BATCH or self._charges.empty():
                    break
                charge = self._charges.get()
            if batch:
                rows = [(key, field, usd, expires) for key, expires, fields, usd in batch for field in fields]
                try:
                    self._db.execute("BEGIN IMMEDIATE")  # one transaction: all of the batch or none of it
                    self._db.executemany("INSERT INTO spend VALUES (?, ?, ?, ?) ON CONFLICT (key, field) DO UPDATE "
                                         "SET usd = usd + excluded.usd, expires = max(expires, excluded.expires)", rows)
                    self._db.execute("COMMIT")
                except sqlite3.Error as exc:  # the process keeps counting them; the file (restarts, other workers) misses them
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    self._unwritten += batch
                    log.error("could not add %d charges to %s: %s", len(rows), self.path, exc)
                written += len(batch)
            if charge is None:
                self._db.close()
                return

    def _read_back(self, written: int) -> None:
        try:
            self.view = (written, self.load(time.time()))  # expired records deleted on the way: the file stays small
        except sqlite3.Error as exc:  # the last view stands; the next write or idle second tries again
            log.error("could not read spend back from %s: %s", self.path, exc)
