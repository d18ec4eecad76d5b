"""One stored response larger than a read's budget, read from the SQLite store a part at a time.

The store's calls take turns per team in one thread (sdk/responses/sqlite_store.py): a record of tens of
mebibytes (a team's request body may be as large as its `limits.max_body_bytes`) read in one turn
held every other team's store calls for all of it. `LargeRead` reads it `part_bytes` a turn
through SQLite's incremental blob I/O, on a read-only connection of its own held in one read
transaction from the first part to the last: what other turns write meanwhile (the same record
deleted or replaced, say) does not change what it reads, so it never mixes two versions, and the
store's own connection writes on (WAL lets a reader's snapshot stand beside a writer). The bytes
are parsed by the caller once they are all read (in the heavy-work pool, as the team's work).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

_HEAD = ("SELECT rowid, id, team, provider, native, created_at, previous, depth, chain_bytes FROM stored_responses "
         "WHERE team = ? AND id = ? AND expires_at >= ?")


class LargeRead:
    """The record's columns but its two blobs, then the blobs' bytes one part per `read_part`."""

    def __init__(self, db: sqlite3.Connection, head: tuple[Any, ...], part_bytes: int):
        self._db = db
        self.head = head[1:]  # id, team, provider, native, created_at, previous, depth, chain_bytes
        self._blobs = [db.blobopen("stored_responses", column, head[0], readonly=True) for column in ("input", "response")]
        self._read: list[list[bytes]] = [[], []]
        self._part_bytes = part_bytes
        self.parts_read = 0

    @classmethod
    def open(cls, path: Path, team: str, response_id: str, now: float, part_bytes: int) -> LargeRead | None:
        """The team's unexpired record `response_id`, its blobs not read yet; None when it has none."""
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False, isolation_level=None)
        try:
            db.execute("BEGIN")  # one snapshot for every part
            head = db.execute(_HEAD, (team, response_id, now)).fetchone()
            if head is not None:
                return cls(db, head, part_bytes)
        except BaseException:
            db.close()
            raise
        db.close()
        return None

    @property
    def done(self) -> bool:
        return not self._blobs

    def read_part(self) -> None:
        """Up to `part_bytes` more of the blobs; the connection is closed after the last part."""
        left = self._part_bytes
        while self._blobs and left > 0:
            blob = self._blobs[0]
            part = blob.read(left)
            self._read[2 - len(self._blobs)].append(part)
            left -= len(part)
            if blob.tell() == len(blob):
                blob.close()
                self._blobs.pop(0)
        self.parts_read += 1
        if not self._blobs:
            self.close()

    def close(self) -> None:
        for blob in self._blobs:
            blob.close()
        self._blobs = []
        self._db.close()

    def row(self) -> tuple[Any, ...]:
        """The record's row as the store reads one (its `_COLUMNS`): call when `done`."""
        rid, team, provider, native, created_at, previous, depth, chain_bytes = self.head
        input_, response = (b"".join(parts) for parts in self._read)
        return rid, team, provider, native, created_at, input_, response, previous, depth, chain_bytes
