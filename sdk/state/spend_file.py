"""Spend that outlives the process, for the in-process state backend (`slipstream serve` without Redis).

Budgets are per day or month, but in-process spend records lived as long as the process: a restart
(a deploy, a crash) set every team's spend back to nothing, and a team that had used its month's
budget had all of it again. `slipstream serve` without `--state-url` keeps them in a SQLite file
(`$SLIPSTREAM_DATA_DIR/spend.sqlite3`, or `SLIPSTREAM_SPEND_FILE`): the backend reads the live
records once when it opens, and every charge after that is added to the file by a writer thread
(the event loop never waits on the disk). The file holds sums, so the workers of
`--workers N --local-state` add theirs to the same records, and each starts from all of them.
"""

from __future__ import annotations

import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger("slipstream.state")

ENV = "SLIPSTREAM_SPEND_FILE"  # set by `slipstream serve` for its workers; an embedding program may set it too
_BATCH = 256  # charges written in one transaction at most


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
        self._writer = threading.Thread(target=self._write, name="slipstream-spend-file", daemon=True)
        self._writer.start()

    def load(self, now: float) -> dict[str, tuple[float, dict[str, float]]]:
        """The live records: key -> (expiry, {field: USD}); expired ones are deleted."""
        self._db.execute("DELETE FROM spend WHERE expires <= ?", (now,))
        records: dict[str, tuple[float, dict[str, float]]] = {}
        for key, field, usd, expires in self._db.execute("SELECT key, field, usd, expires FROM spend"):
            records.setdefault(key, (expires, {}))[1][field] = usd
        return records

    def add(self, key: str, expires: float, fields: Iterable[str], usd: float) -> None:
        """Add `usd` to each of the record's `fields` (in the writer thread, soon)."""
        self._charges.put((key, expires, tuple(fields), usd))

    def close(self) -> None:
        """Write what is queued and stop the writer."""
        self._charges.put(None)
        self._writer.join(timeout=10)

    def _write(self) -> None:
        while True:
            charge = self._charges.get()
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
                except sqlite3.Error as exc:  # the process keeps counting in memory; only the restart copy misses these
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    log.error("could not add %d charges to %s: %s", len(rows), self.path, exc)
            if charge is None:
                self._db.close()
                return
