"""Spend that outlives the process, for the in-process state backend (`slipstream serve` without Redis).

Budgets are per day or month, but in-process spend records lived as long as the process: a restart
(a deploy, a crash) set every team's spend back to nothing, and a team that had used its month's
budget had all of it again. `slipstream serve` without `--state-url` keeps them in a SQLite file
(`$SLIPSTREAM_DATA_DIR/spend.sqlite3`, or `SLIPSTREAM_SPEND_FILE`): a writer thread adds the charges,
summed per record, once every REFRESH_S (the event loop never waits on the disk) and then reads the
live records back (`view`); a crash loses at most that second's charges. The file holds sums, so the
workers of `--workers N --local-state` add theirs to the same records and each sees all of them
within a second or two: a team's budget and its spend report are the host's, whichever worker
answers. Read once at start, each worker saw its own charges alone after that, and a team could
spend its budget once per worker.

A batch's worst cost is held host-wide here too (`hold_batch`): a batch runs after the call creating
it, and its hold can be the whole of what is left of a budget, so a hold in one worker's memory let
each worker admit a batch against the same remainder. The check (this worker's spend and requests in
flight, every worker's batch holds and the file's spend) and the hold are one `BEGIN IMMEDIATE`
transaction; the hold ends in another that writes the batch's creation charge in its place
(`end_batch_hold`), so no worker sees neither.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger("slipstream.state")

ENV = "SLIPSTREAM_SPEND_FILE"  # set by `slipstream serve` for its workers; an embedding program may set it too
REFRESH_S = 1.0  # the writer writes this process's charges, and reads every worker's back, this often
BATCH_HOLD_S = 600.0  # a batch hold a worker never ended (it died creating the batch) lapses after this

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
        self._db.execute("CREATE TABLE IF NOT EXISTS batch_holds (lease TEXT PRIMARY KEY, key TEXT NOT NULL, usd REAL NOT NULL, "
                         "expires REAL NOT NULL)")
        # batch holds are taken and ended from the event loop's side, on a connection of their own
        self._holds_db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10)
        self._holds_lock = threading.Lock()
        # Charges not written yet, in the order they came: a request costs one deque append on the event
        # loop (thread-safe: no lock), and the writer one row per record and field a second, however many came.
        self._charges: deque[tuple[str, float, tuple[str, ...], float]] = deque()
        self._queued = 0  # charges handed to the writer so far (by the event loop's thread)
        self._unwritten: list[tuple[str, str, float, float]] = []  # rows a write failed to add: this process still counts them
        # (charges of this process the records include, every live record): replaced whole by the writer
        self.view: tuple[int, Records] = (0, self.load(time.time()))
        self._stop = threading.Event()
        self._writer = threading.Thread(target=self._write, name="slipstream-spend-file", daemon=True)
        self._writer.start()

    def load(self, now: float) -> Records:
        """The live records; expired ones are deleted."""
        self._db.execute("DELETE FROM spend WHERE expires <= ?", (now,))
        return self._read(now)

    def add(self, key: str, expires: float, fields: Iterable[str], usd: float) -> int:
        """Add `usd` to each of the record's `fields` (by the writer, within REFRESH_S); returns the
        charge's number, which `view` counts once the records it holds include it."""
        self._charges.append((key, expires, tuple(fields), usd))
        self._queued += 1
        return self._queued

    def hold_batch(self, key: str, lease: str, usd: float, limit: float, seen: float, extra: float, now: float) -> float | None:
        """Hold `usd` for a batch against budget record `key` unless what is spent and held reaches
        `limit` (the budget less `usd`): the file's `total` (every worker's written charges) or `seen`
        (the caller's last read of it), whichever is more, plus `extra` (the caller's own charges not
        read back yet, some perhaps written already and so counted twice, leaning high, and its requests
        in flight) and every worker's batch holds. One transaction, so two workers' batches cannot each
        fit the same remainder. Returns None once held, else what is spent and held (the refusal's value)."""
        with self._holds_lock:
            db = self._holds_db
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("DELETE FROM batch_holds WHERE expires <= ?", (now,))
                row = db.execute("SELECT usd FROM spend WHERE key = ? AND field = 'total' AND expires > ?", (key, now)).fetchone()
                (held,) = db.execute("SELECT COALESCE(SUM(usd), 0) FROM batch_holds WHERE key = ?", (key,)).fetchone()
                spent: float = max(row[0] if row is not None else 0.0, seen) + extra + held
                if spent >= limit:
                    db.execute("ROLLBACK")
                    return spent
                db.execute("INSERT INTO batch_holds VALUES (?, ?, ?, ?)", (lease, key, usd, now + BATCH_HOLD_S))
                db.execute("COMMIT")
                return None
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    def end_batch_hold(self, lease: str, charges: Iterable[tuple[str, float, tuple[str, ...], float]]) -> bool:
        """End a batch's hold and write `charges` ((key, expiry, fields, USD): the batch's creation
        charge; none when the call creating it failed) in the same transaction, so every worker reading
        the file sees the hold or the charge. False when the file refused the write: the caller charges
        them through the writer, and the hold stays until it lapses (leaning high)."""
        rows = [(key, name, usd, expires) for key, expires, fields, usd in charges for name in fields]
        with self._holds_lock:
            db = self._holds_db
            try:
                db.execute("BEGIN IMMEDIATE")
                db.execute("DELETE FROM batch_holds WHERE lease = ?", (lease,))
                db.executemany("INSERT INTO spend VALUES (?, ?, ?, ?) ON CONFLICT (key, field) DO UPDATE "
                               "SET usd = usd + excluded.usd, expires = max(expires, excluded.expires)", rows)
                db.execute("COMMIT")
                return True
            except sqlite3.Error as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                log.error("could not end batch hold %s in %s: %s", lease, self.path, exc)
                return False

    def _read(self, now: float) -> Records:
        records: Records = {}
        for key, field, usd, expires in self._db.execute("SELECT key, field, usd, expires FROM spend WHERE expires > ?", (now,)):
            records.setdefault(key, (expires, {}))[1][field] = usd
        self._unwritten = [row for row in self._unwritten if row[3] > now]
        for key, field, usd, expires in self._unwritten:
            record = records.setdefault(key, (expires, {}))[1]
            record[field] = record.get(field, 0.0) + usd
        return records

    def close(self) -> None:
        """Write what is pending and stop the writer."""
        self._stop.set()
        self._writer.join(timeout=10)
        with self._holds_lock:
            self._holds_db.close()

    def _write(self) -> None:
        # Once every REFRESH_S: the charges summed since, in one transaction, then every live record
        # read back (the other workers' charges with them). The thread holds the GIL the event loop
        # needs while it works, so it works once a second, not once a request.
        stopping, taken = False, 0
        while not stopping:
            stopping = self._stop.wait(REFRESH_S)
            count = len(self._charges)  # those appended by now (the first `count`, numbered in order); later ones wait
            taken += count
            summed: dict[tuple[str, str], tuple[float, float]] = {}  # (key, field) -> (USD, expiry)
            for _ in range(count):
                key, expires, fields, usd = self._charges.popleft()
                for field in fields:
                    total, until = summed.get((key, field), (0.0, expires))
                    summed[(key, field)] = (total + usd, max(until, expires))
            if summed:
                rows = [(key, field, usd, expires) for (key, field), (usd, expires) in summed.items()]
                try:
                    self._db.execute("BEGIN IMMEDIATE")  # one transaction: all of them or none
                    self._db.executemany("INSERT INTO spend VALUES (?, ?, ?, ?) ON CONFLICT (key, field) DO UPDATE "
                                         "SET usd = usd + excluded.usd, expires = max(expires, excluded.expires)", rows)
                    self._db.execute("COMMIT")
                except sqlite3.Error as exc:  # the process keeps counting them; the file (restarts, other workers) misses them
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    self._unwritten += rows
                    log.error("could not add %d charges to %s: %s", len(rows), self.path, exc)
            if not stopping:
                self._read_back(taken)
        self._db.close()

    def _read_back(self, written: int) -> None:
        try:
            self.view = (written, self.load(time.time()))  # expired records deleted on the way: the file stays small
        except sqlite3.Error as exc:  # the last view stands; the next second tries again
            log.error("could not read spend back from %s: %s", self.path, exc)
